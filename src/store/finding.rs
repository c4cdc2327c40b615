//! One finding of a health check: what `doctor` prints a line of, and what a store reports
//! about itself ([`Cluster::health`](crate::store::Cluster::health)).
//!
//! It lives with the store, not with `doctor`, because the store is the lower layer: `doctor`
//! imports the store, never the reverse, so the one type both speak has to be visible from
//! here.

use std::fmt;

/// A check's verdict. Any [`Level::Fail`] makes `doctor` exit non-zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Ok,
    Warn,
    Fail,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Ok => "OK",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        })
    }
}

/// One line of the report: what was checked, its verdict, what was found and, when it is not
/// OK, how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub name: &'static str,
    pub level: Level,
    pub detail: String,
    /// How to fix it, when it is not OK.
    pub fix: Option<String>,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:<4} {:<10} {}", self.level, self.name, self.detail)?;
        if let Some(fix) = &self.fix {
            write!(f, " — fix: {fix}")?;
        }
        Ok(())
    }
}
