//! Who is on the other end of a loopback connection: the user owning the client's socket, read
//! from the kernel's socket table (`/proc/net/tcp`, `/proc/net/tcp6`), where the client's end
//! is the entry whose local address is our peer's and whose remote address is ours. Every local
//! process reaches the shim from 127.0.0.1, so the address says nothing; the user does.
//!
//! Reading that table costs milliseconds however few sockets there are (the kernel walks its
//! whole hash of connections: 3.8 ms a read on a 2-core test machine), which made every poll of
//! an open operator page cost that much (issue 36). A connection's owner never changes, so it is
//! read once per connection ([`PeerUids`]): the transport registers each connection while it is
//! open, and the entry goes with it, so a later connection from the same address and port is
//! never taken for it.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock};

use crate::sync::MutexExt;

/// The owners of the open connections, each read from the table at most once.
#[derive(Debug, Default)]
pub struct PeerUids {
    open: Mutex<HashMap<SocketAddr, Arc<OnceLock<Option<u32>>>>>,
}

/// An open connection's entry in [`PeerUids`]; dropped when the connection ends.
pub struct Open {
    uids: Arc<PeerUids>,
    peer: SocketAddr,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.uids.open.lock_or_recover().remove(&self.peer);
    }
}

impl PeerUids {
    /// Registers a connection from `peer` while the returned guard lives.
    pub fn open(uids: &Arc<PeerUids>, peer: SocketAddr) -> Open {
        uids.open
            .lock_or_recover()
            .insert(peer, Arc::new(OnceLock::new()));
        Open {
            uids: Arc::clone(uids),
            peer,
        }
    }

    /// The uid owning the client socket `peer` connected to `local`: read once while its
    /// connection is open, and read afresh (not kept) for one not registered.
    pub fn uid(&self, peer: SocketAddr, local: SocketAddr) -> Option<u32> {
        let slot = self.open.lock_or_recover().get(&peer).cloned();
        match slot {
            Some(slot) => *slot.get_or_init(|| peer_uid(peer, local)),
            None => peer_uid(peer, local),
        }
    }
}

/// The uid owning the client socket `peer` connected to `local`, if the table shows it.
pub fn peer_uid(peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    let table = match peer.ip() {
        IpAddr::V4(_) => "/proc/net/tcp",
        IpAddr::V6(_) => "/proc/net/tcp6",
    };
    let text = std::fs::read_to_string(table).ok()?;
    let (want_local, want_remote) = (hex_addr(peer), hex_addr(local));
    text.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // sl local_address rem_address st tx:rx tr:when retrnsmt uid ...
        (f.len() > 7
            && f[1].eq_ignore_ascii_case(&want_local)
            && f[2].eq_ignore_ascii_case(&want_remote))
        .then(|| f[7].parse().ok())
        .flatten()
    })
}

/// An address as the socket table writes it: the address's bytes as native-endian 32-bit
/// words in hex, a colon, the port in hex.
fn hex_addr(a: SocketAddr) -> String {
    let words: Vec<u8> = match a.ip() {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    };
    let mut out = String::new();
    for word in words.chunks(4) {
        let w = u32::from_ne_bytes([word[0], word[1], word[2], word[3]]);
        out.push_str(&format!("{w:08X}"));
    }
    format!("{out}:{:04X}", a.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_written_as_the_kernel_table_writes_them() {
        // 127.0.0.1:8080 is `0100007F:1F90` on a little-endian machine.
        let a: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        if cfg!(target_endian = "little") {
            assert_eq!(hex_addr(a), "0100007F:1F90");
        }
    }

    #[test]
    fn an_owner_is_kept_only_while_its_connection_is_open() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let local = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(local).unwrap();
        let (_server, peer) = listener.accept().unwrap();
        let uids = Arc::new(PeerUids::default());
        let me = Some(rustix::process::geteuid().as_raw());
        let open = PeerUids::open(&uids, peer);
        assert_eq!(uids.uid(peer, local), me);
        assert!(uids.open.lock_or_recover()[&peer].get().is_some(), "kept");
        drop(open);
        assert!(
            uids.open.lock_or_recover().is_empty(),
            "gone with the connection"
        );
        // Not registered: read afresh, and not kept.
        assert_eq!(uids.uid(peer, local), me);
        assert!(uids.open.lock_or_recover().is_empty());
        drop(client);
    }

    #[test]
    fn the_owner_of_a_loopback_client_socket_is_found() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_server, peer) = listener.accept().unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        assert_eq!(
            peer_uid(peer, listener.local_addr().unwrap()),
            Some(rustix::process::geteuid().as_raw())
        );
    }
}
