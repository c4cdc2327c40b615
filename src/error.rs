//! Typed errors of the library and the one table that maps them to exit codes.
//!
//! Every fallible library function returns [`Error`]. Binaries add context with `anyhow` at the
//! edge and ask [`Error::kind`] (through [`exit_code_for`]) which exit status to use, so the
//! mapping from failure to exit code lives here and nowhere else. What each code means is written
//! once, in [`exit::TABLE`], which waitpoint(1)'s EXIT STATUS is generated from.

use std::path::PathBuf;

/// The few kinds of failure a user can act on differently; each has one exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Bad arguments, values out of bounds, or a malformed settings file: fix the invocation.
    Usage,
    /// No such waitpoint (or not one this session may see).
    NotFound,
    /// The request conflicts with current state (e.g. cancelling a resolved waitpoint).
    Conflict,
    /// Another daemon already owns the home.
    Locked,
    /// The filesystem failed us; nothing was reported as done.
    Io,
    /// State on disk does not parse; an operator has to look.
    Corrupt,
    /// The home is open to other users (writable by them, or theirs); the daemon will not run.
    Insecure,
    /// This host's daemon no longer leads the shared store's cluster, so its write was refused
    /// and nothing was written: another daemon leads within about a lease's time; retry then.
    Unavailable,
}

/// Exit codes of the `waitpoint` binary. `wait` and `next` add outcome codes on top of these.
pub mod exit {
    /// One row of [`TABLE`]: a code, its constant's name and what it means.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Code {
        pub code: u8,
        pub name: &'static str,
        pub meaning: &'static str,
    }

    /// Declares each row's constant, documented with its meaning, and [`TABLE`] from the same
    /// rows, so that the docs, the man pages and the codes cannot disagree.
    macro_rules! table {
        ($($name:ident = $code:literal: $meaning:literal;)*) => {
            $(#[doc = $meaning] pub const $name: u8 = $code;)*
            /// Every exit code of `waitpoint`, in order; waitpoint(1)'s EXIT STATUS is made
            /// from it.
            pub const TABLE: &[Code] = &[
                $(Code { code: $name, name: stringify!($name), meaning: $meaning }),*
            ];
        };
    }

    table! {
        OK = 0: "Success. For wait, the waitpoint resolved ok. For doctor, no check failed.";
        FAILURE = 1: "A runtime failure: I/O, corrupt state, a daemon already holding the home, \
    or a request that conflicts with the current state (such as cancelling a resolved waitpoint). \
    For doctor, at least one check failed.";
        USAGE = 2: "A usage error: bad flags or values, a missing id or secret, or a malformed \
    settings file.";
        NOT_FOUND = 3: "No such waitpoint, or not one this session may see.";
        RESOLVED_FAIL = 4: "wait: the waitpoint resolved with a failure.";
        EXPIRED = 5: "wait: the waitpoint reached its deadline.";
        CANCELLED = 6: "wait: the waitpoint was cancelled.";
        TIMED_OUT = 7: "wait and next: --timeout elapsed first.";
        UNAVAILABLE = 75: "On an etcd store: this host's daemon no longer leads the cluster (its \
    leadership lease is gone), so nothing was written. Try again after the lease's time \
    (leaseTtlS, 5 s by default), when another daemon leads.";
    }
}

/// Everything the library can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Usage(String),
    /// A request field out of bounds. The text names the request field (`max_signals must be
    /// 1-10000`) so that every front end can show it as it is; a front end may add its own hint
    /// (the CLI names the flag, see `cli::field_hint`).
    #[error("{field} {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error("{path}: {message}")]
    Settings { path: PathBuf, message: String },
    /// No such waitpoint, timer, callback or wake (`what`: the kind looked for, whatever the
    /// id looks like). `scoped` when the lookup was for one session's own: then it may exist
    /// and be another's, and the text says so without saying which.
    #[error("{}", not_found_text(what, id, *scoped))]
    NotFound {
        what: &'static str,
        id: String,
        scoped: bool,
    },
    /// The request conflicts with the state as it is now: a stale read (it changed since it
    /// was read; read it again), or an operation the state does not allow.
    #[error("{0}")]
    Conflict(String),
    /// A daemon's fenced write refused because it does not lead the shared store's cluster
    /// (any more): its leadership lease is gone, or it never held one, so nothing was written.
    /// Not a stale read: reading again does not help, waiting does. `retry_after_s` is the
    /// lease's time to live, about how long the cluster takes to let another daemon lead.
    #[error(
        "this host no longer leads the cluster (its leadership lease is gone), so nothing was \
         written; retry in {retry_after_s} s, by when another daemon leads"
    )]
    LeaseLost { retry_after_s: u64 },
    #[error("another daemon holds {path} (pid {pid}); stop it first or use another --home")]
    Locked { path: PathBuf, pid: String },
    #[error("{context} {path}: {source}")]
    Io {
        context: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: does not parse: {message}")]
    Corrupt { path: PathBuf, message: String },
    /// The shared store (etcd) failed or did not answer; nothing was reported as done. The
    /// store is named without credentials.
    #[error("{store}: {message}")]
    Store { store: String, message: String },
    #[error("{path}: {message}; refusing to run on a home other users can change")]
    Insecure { path: PathBuf, message: String },
}

impl Error {
    /// The kind of failure, which decides the exit code.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Usage(_) | Error::Invalid { .. } | Error::Settings { .. } => ErrorKind::Usage,
            Error::NotFound { .. } => ErrorKind::NotFound,
            Error::Conflict(_) => ErrorKind::Conflict,
            Error::Locked { .. } => ErrorKind::Locked,
            Error::Io { .. } | Error::Store { .. } => ErrorKind::Io,
            Error::Corrupt { .. } => ErrorKind::Corrupt,
            Error::Insecure { .. } => ErrorKind::Insecure,
            Error::LeaseLost { .. } => ErrorKind::Unavailable,
        }
    }

    /// How many seconds a caller should wait before it tries again, for an error that passes
    /// with time ([`ErrorKind::Unavailable`]).
    pub fn retry_after_s(&self) -> Option<u64> {
        match self {
            Error::LeaseLost { retry_after_s } => Some(*retry_after_s),
            _ => None,
        }
    }

    /// The same error again, for each of several items one failure decided (the signals of a
    /// batch that could not commit): the variant, and so the kind, the exit code and the HTTP
    /// status, is kept; an I/O error keeps its kind and text.
    pub fn replicate(&self) -> Error {
        match self {
            Error::Usage(m) => Error::Usage(m.clone()),
            Error::Invalid { field, reason } => Error::Invalid {
                field,
                reason: reason.clone(),
            },
            Error::Settings { path, message } => Error::Settings {
                path: path.clone(),
                message: message.clone(),
            },
            Error::NotFound { what, id, scoped } => Error::NotFound {
                what,
                id: id.clone(),
                scoped: *scoped,
            },
            Error::Conflict(m) => Error::Conflict(m.clone()),
            Error::LeaseLost { retry_after_s } => Error::LeaseLost {
                retry_after_s: *retry_after_s,
            },
            Error::Locked { path, pid } => Error::Locked {
                path: path.clone(),
                pid: pid.clone(),
            },
            Error::Io {
                context,
                path,
                source,
            } => Error::Io {
                context,
                path: path.clone(),
                source: match source.raw_os_error() {
                    Some(code) => std::io::Error::from_raw_os_error(code),
                    None => std::io::Error::new(source.kind(), source.to_string()),
                },
            },
            Error::Corrupt { path, message } => Error::Corrupt {
                path: path.clone(),
                message: message.clone(),
            },
            Error::Store { store, message } => Error::Store {
                store: store.clone(),
                message: message.clone(),
            },
            Error::Insecure { path, message } => Error::Insecure {
                path: path.clone(),
                message: message.clone(),
            },
        }
    }

    /// A request field out of bounds: `invalid("max_signals", "must be 1-10000")`.
    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Error::Invalid {
            field,
            reason: reason.into(),
        }
    }

    /// Wraps an I/O error with what we were doing and where.
    pub fn io(context: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            context,
            path: path.into(),
            source,
        }
    }

    /// Whether this is an I/O error for something that does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}

fn not_found_text(kind: &str, id: &str, scoped: bool) -> String {
    if scoped {
        format!("no {kind} {id} (or it is not this session's)")
    } else {
        format!("no {kind} {id}")
    }
}

impl Error {
    /// Not found among `session`'s own (see [`Error::NotFound`]).
    pub fn not_found_for_session(what: &'static str, id: &str) -> Self {
        Error::NotFound {
            what,
            id: id.to_owned(),
            scoped: true,
        }
    }

    /// Not found at all.
    pub fn not_found(what: &'static str, id: &str) -> Self {
        Error::NotFound {
            what,
            id: id.to_owned(),
            scoped: false,
        }
    }
}

/// The exit code for an error kind.
pub fn exit_code(kind: ErrorKind) -> u8 {
    match kind {
        ErrorKind::Usage => exit::USAGE,
        ErrorKind::NotFound => exit::NOT_FOUND,
        ErrorKind::Conflict
        | ErrorKind::Locked
        | ErrorKind::Io
        | ErrorKind::Corrupt
        | ErrorKind::Insecure => exit::FAILURE,
        ErrorKind::Unavailable => exit::UNAVAILABLE,
    }
}

/// The exit code for an error that reached a binary's `main`: a library [`Error`] anywhere in
/// the chain decides; anything else is a plain failure.
pub fn exit_code_for(err: &anyhow::Error) -> u8 {
    err.chain()
        .find_map(|e| e.downcast_ref::<Error>())
        .map_or(exit::FAILURE, |e| exit_code(e.kind()))
}

/// True when the error is a closed stdout (`waitpoint check | head`), which is not a failure.
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        let io = e
            .downcast_ref::<std::io::Error>()
            .map(std::io::Error::kind)
            .or_else(|| {
                // JSON output fails through serde_json, which keeps the io error's kind.
                e.downcast_ref::<serde_json::Error>()
                    .and_then(serde_json::Error::io_error_kind)
            });
        io == Some(std::io::ErrorKind::BrokenPipe)
    })
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_lease_is_its_own_kind_and_exit_code_apart_from_a_stale_read() {
        let lost = Error::LeaseLost { retry_after_s: 5 };
        assert_eq!(lost.kind(), ErrorKind::Unavailable);
        assert_eq!(exit_code(lost.kind()), exit::UNAVAILABLE);
        assert_eq!(exit_code_for(&anyhow::Error::new(lost)), 75);
        let stale = Error::Conflict("it changed since it was read".into());
        assert_eq!(stale.kind(), ErrorKind::Conflict);
        assert_eq!(exit_code(stale.kind()), exit::FAILURE);
        assert_eq!(stale.retry_after_s(), None);
        let lost = Error::LeaseLost { retry_after_s: 5 };
        assert_eq!(lost.retry_after_s(), Some(5));
        let text = lost.to_string();
        assert!(
            text.contains("no longer leads") && text.contains("retry in 5 s"),
            "{text}"
        );
    }

    #[test]
    fn a_replicated_error_keeps_its_kind_its_retry_and_its_text() {
        let all = [
            Error::Usage("u".into()),
            Error::invalid("max_signals", "must be 1-10000"),
            Error::not_found("waitpoint", "wp_1"),
            Error::Conflict("moved".into()),
            Error::LeaseLost { retry_after_s: 5 },
            Error::io("cannot write", "/x", std::io::Error::from_raw_os_error(28)),
            Error::io("cannot read", "/y", std::io::Error::other("odd")),
            Error::Corrupt {
                path: "/z".into(),
                message: "line 2".into(),
            },
            Error::Store {
                store: "etcd".into(),
                message: "down".into(),
            },
        ];
        for e in &all {
            let again = e.replicate();
            assert_eq!(again.kind(), e.kind(), "{e}");
            assert_eq!(again.retry_after_s(), e.retry_after_s(), "{e}");
            assert_eq!(again.to_string(), e.to_string());
        }
    }
}
