//! A remote directory's long listing over SFTP: each entry with its attributes and the link
//! count the server's `ls -l`-style line gives, which the SFTP attributes do not carry.
//!
//! The local spool refuses a file with more than one link (its content lives elsewhere too);
//! a device's spool must refuse it as well, and the only place SFTP version 3 says how many
//! links a file has is the "longname" of a directory entry. `ssh2` drops that line, so this
//! listing calls libssh2 itself, on a second SFTP channel of the same session. Transport only:
//! what to do with a hard-linked file is the collector's rule.

use std::ffi::{CStr, CString, c_char, c_int, c_uint};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use libssh2_sys as raw;
use ssh2::{FileStat, Session};

/// One entry of a long listing.
#[derive(Debug, Clone)]
pub struct LongEntry {
    pub name: String,
    pub stat: FileStat,
    /// The link count from the server's long name; `None` when the server gives no such line
    /// (the protocol leaves its format to the server; OpenSSH writes `ls -l`'s).
    pub links: Option<u64>,
}

/// Lists `dir` on the session's server; `Ok(None)` when it does not exist. Names that are not
/// UTF-8 are left out (no spool file is named so). Errors are libssh2's messages.
pub fn list_long(session: &Session, dir: &Path) -> Result<Option<Vec<LongEntry>>, String> {
    let path = CString::new(dir.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    // `Session::raw` locks the session for as long as the guard lives, so nothing else uses
    // it while this listing runs; the session's timeout bounds every call below.
    let mut guard = session.raw();
    let sess: *mut raw::LIBSSH2_SESSION = &mut *guard;
    // SAFETY: `sess` is a live, locked session; every pointer passed below is valid for the
    // call, and the SFTP channel and handle made here are closed before returning.
    unsafe {
        let sftp = raw::libssh2_sftp_init(sess);
        if sftp.is_null() {
            return Err(last_error(sess));
        }
        let listed = list_in(sess, sftp, &path);
        raw::libssh2_sftp_shutdown(sftp);
        listed
    }
}

/// # Safety
/// `sess` and `sftp` must be live, and `sftp` a channel of `sess`.
unsafe fn list_in(
    sess: *mut raw::LIBSSH2_SESSION,
    sftp: *mut raw::LIBSSH2_SFTP,
    path: &CStr,
) -> Result<Option<Vec<LongEntry>>, String> {
    let len = path.to_bytes().len() as c_uint;
    // SAFETY: (the caller's) live channel; a NUL-terminated path of `len` bytes.
    let handle = unsafe {
        raw::libssh2_sftp_open_ex(sftp, path.as_ptr(), len, 0, 0, raw::LIBSSH2_SFTP_OPENDIR)
    };
    if handle.is_null() {
        // SAFETY: a live channel.
        let code = unsafe { raw::libssh2_sftp_last_error(sftp) };
        if code == raw::LIBSSH2_FX_NO_SUCH_FILE as std::ffi::c_ulong {
            return Ok(None);
        }
        // SAFETY: a live session.
        return Err(unsafe { last_error(sess) });
    }
    // Large buffers: libssh2 skips an entry that does not fit rather than asking again.
    let mut name = vec![0 as c_char; 4096];
    let mut long = vec![0 as c_char; 8192];
    let mut out = Vec::new();
    let result = loop {
        // SAFETY: zeroed attributes are valid; libssh2 fills them.
        let mut attrs: raw::LIBSSH2_SFTP_ATTRIBUTES = unsafe { std::mem::zeroed() };
        long[0] = 0;
        // SAFETY: a live handle; buffers of the lengths given.
        let rc = unsafe {
            raw::libssh2_sftp_readdir_ex(
                handle,
                name.as_mut_ptr(),
                name.len(),
                long.as_mut_ptr(),
                long.len(),
                &mut attrs,
            )
        };
        match rc {
            0 => break Ok(Some(out)),
            n if n < 0 => break Err(unsafe { last_error(sess) }),
            n => {
                let bytes: Vec<u8> = name[..n as usize].iter().map(|&c| c as u8).collect();
                // SAFETY: libssh2 NUL-terminates the long name (left empty when none came).
                let long_name = unsafe { CStr::from_ptr(long.as_ptr()) }.to_string_lossy();
                if let Ok(entry_name) = String::from_utf8(bytes) {
                    out.push(LongEntry {
                        name: entry_name,
                        stat: FileStat::from_raw(&attrs),
                        links: links_of(&long_name),
                    });
                }
            }
        }
    };
    // SAFETY: the handle opened above, closed once.
    unsafe { raw::libssh2_sftp_close_handle(handle) };
    result
}

/// The link count in an `ls -l`-style line: its second field.
fn links_of(long_name: &str) -> Option<u64> {
    let mut fields = long_name.split_whitespace();
    let mode = fields.next()?;
    // The mode field of `ls -l` is ten characters of file type and permissions.
    if mode.len() < 10 {
        return None;
    }
    fields.next()?.parse().ok()
}

/// # Safety
/// `sess` must be live.
unsafe fn last_error(sess: *mut raw::LIBSSH2_SESSION) -> String {
    let mut msg: *mut c_char = std::ptr::null_mut();
    let mut len: c_int = 0;
    // SAFETY: a live session; libssh2 points `msg` at its own buffer (not to be freed: want_buf 0).
    let code = unsafe { raw::libssh2_session_last_error(sess, &mut msg, &mut len, 0) };
    if msg.is_null() || len <= 0 {
        return format!("libssh2 error {code}");
    }
    // SAFETY: `len` bytes at `msg`, owned by the session and valid until its next call.
    let bytes = unsafe { std::slice::from_raw_parts(msg as *const u8, len as usize) };
    String::from_utf8_lossy(bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::links_of;

    #[test]
    fn the_link_count_is_read_from_an_ls_line_and_nothing_else() {
        assert_eq!(
            links_of("-rw-r--r--    2 root     root          123 Dec  1 21:00 a.json"),
            Some(2)
        );
        assert_eq!(links_of("-rw-r--r-- 1 u g 5 Jan 1 2026 b.json"), Some(1));
        assert_eq!(links_of(""), None);
        assert_eq!(links_of("a.json"), None);
        assert_eq!(links_of("-rw-r--r-- x u g"), None);
    }
}
