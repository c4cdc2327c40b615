//! Who is on the other end of a loopback connection: the user owning the client's socket, read
//! from the kernel's socket table (`/proc/net/tcp`, `/proc/net/tcp6`), where the client's end
//! is the entry whose local address is our peer's and whose remote address is ours. Every local
//! process reaches the shim from 127.0.0.1, so the address says nothing; the user does.

use std::net::{IpAddr, SocketAddr};

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
