//! Addresses for the servers a test starts: loopback ones, and this machine's own address off
//! loopback for a server that must be tested where other machines could reach it.

use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};

use anyhow::{Context, Result, bail};

/// A loopback address the kernel just handed out and nothing listens on now. For a listener
/// this process binds at once; a port given to another process should come from [`free_port`].
pub fn free_addr() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free loopback port")?;
    Ok(listener.local_addr()?)
}

/// A loopback TCP port nobody listens on right now, for another process to bind.
///
/// Drawn from 20000-32767, below Linux's ephemeral range (as `scripts/control-plane.sh` does),
/// so that outgoing connections do not take it between now and the other process's bind.
pub fn free_port() -> Result<u16> {
    use std::hash::{BuildHasher, Hasher};
    for attempt in 0..200u64 {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(u64::from(std::process::id()));
        hasher.write_u64(attempt);
        let port = 20000 + (hasher.finish() % 12768) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no free loopback port found in 20000-32767")
}

/// This machine's own address off loopback, if it has one this process can listen on: the source
/// address of its route to an outside address (found by connecting a UDP socket, which sends
/// nothing), IPv4 first.
pub fn host_address() -> Option<IpAddr> {
    let probe = |local: &str, outside: &str| {
        let socket = UdpSocket::bind(local).ok()?;
        socket.connect(outside).ok()?;
        let ip = socket.local_addr().ok()?.ip();
        let usable =
            !ip.is_loopback() && !ip.is_unspecified() && TcpListener::bind((ip, 0)).is_ok();
        usable.then_some(ip)
    };
    // Documentation addresses (TEST-NET-3, 2001:db8::/32): routed like any, never answered.
    probe("0.0.0.0:0", "203.0.113.1:9").or_else(|| probe("[::]:0", "[2001:db8::1]:9"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_port_is_in_the_range_below_the_ephemeral_ports_and_bindable() -> Result<()> {
        let port = free_port()?;
        assert!((20000..32768).contains(&port), "{port}");
        TcpListener::bind(("127.0.0.1", port))?;
        let addr = free_addr()?;
        assert!(addr.ip().is_loopback());
        TcpListener::bind(addr)?;
        Ok(())
    }

    #[test]
    fn the_host_address_is_off_loopback_and_bindable() -> Result<()> {
        // A machine without a route out has none; one it names must be usable.
        if let Some(ip) = host_address() {
            assert!(!ip.is_loopback() && !ip.is_unspecified(), "{ip}");
            TcpListener::bind((ip, 0))?;
        }
        Ok(())
    }
}
