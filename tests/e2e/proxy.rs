//! A TCP proxy between the extender and kube-apiserver that injects network faults on command:
//! hold every answer the API server sends (watch events and responses alike) while requests still
//! reach it, so that an API write lands while the extender cannot see it; and sever every
//! connection at once (a broken watch); or cut the network for good (every connection severed,
//! every new one closed at once: a partition). It forwards bytes only (TLS passes through untouched:
//! the API server's certificate names 127.0.0.1, whatever the port).
//!
//! A hold must let TLS handshakes finish, or a connection opened during it would never send its
//! request: a connection's answers are held only once it is established, that is once the client
//! has sent again after the server first spoke (TLS 1.3: the client's Finished, with or just
//! before its first request).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy is doing to the traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Bytes flow both ways.
    Pass,
    /// Requests flow to the API server; its answers wait in the proxy until [`Mode::Pass`].
    Hold,
}

#[derive(Debug)]
struct Shared {
    upstream: SocketAddr,
    mode: watch::Sender<Mode>,
    /// Bumped by [`FaultProxy::sever`]: every connection opened before ends.
    generation: watch::Sender<u64>,
    connections: AtomicU64,
    /// Set by [`FaultProxy::cut`]: new connections are closed unanswered.
    cut: AtomicBool,
}

/// A running fault-injecting proxy; stops with the runtime that started it.
#[derive(Debug, Clone)]
pub struct FaultProxy {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the fault proxy")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream,
            mode: watch::channel(Mode::Pass).0,
            generation: watch::channel(0).0,
            connections: AtomicU64::new(0),
            cut: AtomicBool::new(false),
        });
        let accepting = shared.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let shared = accepting.clone();
                if shared.cut.load(Ordering::Acquire) {
                    drop(client);
                    continue;
                }
                tokio::spawn(async move {
                    // A connection the API server refuses (it is restarting) just closes.
                    // (A connection accepted just before a cut ends here.)
                    if let Ok(server) = TcpStream::connect(shared.upstream).await
                        && !shared.cut.load(Ordering::Acquire)
                    {
                        shared.connections.fetch_add(1, Ordering::Relaxed);
                        connection(shared, client, server).await;
                    }
                });
            }
        });
        Ok(Self { addr, shared })
    }

    /// From now on the API server's answers wait in the proxy; requests still reach it.
    pub fn hold(&self) {
        self.shared.mode.send_replace(Mode::Hold);
    }

    /// Delivers everything held and lets bytes flow again.
    pub fn release(&self) {
        self.shared.mode.send_replace(Mode::Pass);
    }

    /// Closes every open connection (watches included); new connections are accepted.
    pub fn sever(&self) {
        self.shared.generation.send_modify(|g| *g += 1);
    }

    /// A network partition: every open connection ends and every new one is closed at once,
    /// for the rest of the proxy's life.
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::Release);
        self.sever();
    }

    /// Connections forwarded so far.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Relaxed)
    }
}

/// Forwards one connection until either side closes it or the proxy severs it.
async fn connection(shared: Arc<Shared>, client: TcpStream, server: TcpStream) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let handshake = Arc::new(Handshake::default());
    let mut generation = shared.generation.subscribe();
    generation.mark_unchanged();
    let requests = requests(client_read, server_write, handshake.clone());
    let answers = answers(server_read, client_write, shared.clone(), handshake);
    tokio::select! {
        () = requests => {}
        () = answers => {}
        _ = generation.changed() => {}
    }
}

/// How far a connection's TLS handshake has come, as seen from the bytes' directions.
#[derive(Debug, Default)]
struct Handshake {
    server_spoke: AtomicBool,
    established: AtomicBool,
}

/// Client to server: always flows; marks the connection established once the client sends
/// after the server's first flight.
async fn requests(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, handshake: Arc<Handshake>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if handshake.server_spoke.load(Ordering::Acquire) {
            handshake.established.store(true, Ordering::Release);
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Server to client: flows in [`Mode::Pass`] and during the handshake; buffered in
/// [`Mode::Hold`] once established, and delivered on release.
async fn answers(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    shared: Arc<Shared>,
    handshake: Arc<Handshake>,
) {
    let mut mode = shared.mode.subscribe();
    let mut held: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let holding = *mode.borrow_and_update() == Mode::Hold;
        if !holding && !held.is_empty() {
            if to.write_all(&held).await.is_err() {
                return;
            }
            held.clear();
        }
        tokio::select! {
            read = from.read(&mut buf) => {
                let n = match read {
                    Ok(0) | Err(_) => {
                        // Deliver what was held before closing, unless still holding.
                        if !holding {
                            let _ = to.write_all(&held).await;
                        }
                        return;
                    }
                    Ok(n) => n,
                };
                handshake.server_spoke.store(true, Ordering::Release);
                if *mode.borrow() == Mode::Hold && handshake.established.load(Ordering::Acquire) {
                    held.extend_from_slice(&buf[..n]);
                } else if to.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
            changed = mode.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}
