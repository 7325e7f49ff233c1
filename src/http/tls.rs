//! TLS for the extender listener (`server.tls`, HTTPS) and the Karmada estimator's gRPC listener
//! (`estimator.tls`, ALPN `h2`): rustls with the ring provider, serving the
//! certificate and key files named in the configuration and picking up rotated files without a
//! restart; optionally requiring client certificates signed by `server.tls.clientCaFile`.
//!
//! How a rotation is picked up: a task reads the certificate, key and client-CA files every
//! `server.tls.reloadIntervalSeconds`. When their bytes differ from the last ones it read, it
//! builds a new rustls `ServerConfig` and swaps it in (an [`ArcSwap`]). Each connection's
//! handshake uses the configuration in force when the connection is accepted, so new
//! connections get the new certificate at most one interval (plus the read) after the files
//! change; connections already open keep the certificate they were handshaken with.
//! Comparing contents rather than modification times also catches the atomic symlink swap with
//! which the kubelet updates a mounted Secret. Files that do not parse, or a key that does not
//! match its certificate (a rotation caught between the two writes), leave the previous
//! configuration in force with a warning, and are read again at the next tick.
//!
//! Handshakes run in tasks of their own, [`HANDSHAKE_TIMEOUT`] at most each and
//! [`MAX_HANDSHAKES`] at once (past it, new clients wait in the kernel's accept queue), so a
//! client that stalls mid-handshake holds up no other and a flood of them holds bounded memory;
//! [`TlsListener`] hands the server only finished handshakes. With `allowedClientNames`, a
//! client certificate the CA signed is accepted only for one of those names.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::AbortHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tracing::{debug, info, warn};

use crate::config::TlsConfig;

/// The longest a client may take to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshakes in progress at once per listener: what clients that never finish can hold is
/// bounded (a few KiB each), and the bound is high enough that stalled clients, each cut off
/// after [`HANDSHAKE_TIMEOUT`], rarely make a real one wait. kube-scheduler keeps its
/// connections (HTTP/2), so it handshakes rarely.
pub const MAX_HANDSHAKES: usize = 1024;

/// Finished handshakes waiting for axum to take them.
const ACCEPT_QUEUE: usize = 64;

/// Which listener a TLS configuration serves: the configuration key its errors name, and the
/// application protocols it offers in the handshake (ALPN), preferred first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// The extender listener (`server.tls`): HTTP/2, then HTTP/1.1. kube-scheduler's extender
    /// client (Go's transport, configured for HTTP/2 by client-go) then sends every call over
    /// one connection; over HTTP/1.1 it keeps at most two idle connections, so with a bind in
    /// flight beside the next pod's filter it opens (and handshakes) new ones all along.
    /// Clients that offer no ALPN, or only `http/1.1`, get HTTP/1.1.
    Extender,
    /// The Karmada estimator's gRPC listener (`estimator.tls`): HTTP/2, which gRPC clients
    /// insist on in ALPN.
    Estimator,
    /// The admin listener (`server.adminTls`): HTTP/2, then HTTP/1.1 (Prometheus and browsers
    /// speak either).
    Admin,
    /// The admission webhook (`webhook.tls`): HTTP/2, then HTTP/1.1, as kube-apiserver offers.
    Webhook,
}

impl Served {
    fn key(self) -> &'static str {
        match self {
            Self::Extender => "server.tls",
            Self::Estimator => "estimator.tls",
            Self::Admin => "server.adminTls",
            Self::Webhook => "webhook.tls",
        }
    }

    fn alpn(self) -> &'static [&'static [u8]] {
        match self {
            Self::Extender | Self::Admin | Self::Webhook => &[b"h2", b"http/1.1"],
            Self::Estimator => &[b"h2"],
        }
    }
}

/// The bytes of the files a configuration was built from; a change in any starts a reload.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Material {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

fn read(path: &Path, key: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("{key}: cannot read {}", path.display()))
}

impl Material {
    fn read(files: &TlsConfig, served: Served) -> anyhow::Result<Self> {
        let key = served.key();
        Ok(Self {
            cert: read(&files.cert_file, &format!("{key}.certFile"))?,
            key: read(&files.key_file, &format!("{key}.keyFile"))?,
            client_ca: files
                .client_ca_file
                .as_deref()
                .map(|path| read(path, &format!("{key}.clientCaFile")))
                .transpose()?,
        })
    }

    /// The rustls configuration these files make; errors name the key at fault.
    fn server_config(
        &self,
        files: &TlsConfig,
        served: Served,
    ) -> anyhow::Result<Arc<ServerConfig>> {
        let tls = served.key();
        let cert_file = files.cert_file.display();
        let chain = CertificateDer::pem_slice_iter(&self.cert)
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("{tls}.certFile: {cert_file} is not PEM"))?;
        anyhow::ensure!(
            !chain.is_empty(),
            "{tls}.certFile: {cert_file} holds no CERTIFICATE block"
        );
        let key = PrivateKeyDer::from_pem_slice(&self.key).with_context(|| {
            format!(
                "{tls}.keyFile: {} holds no PEM private key",
                files.key_file.display()
            )
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .context("setting up TLS")?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(pem) => {
                let ca_file = files
                    .client_ca_file
                    .as_deref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default();
                let mut roots = RootCertStore::empty();
                for cert in CertificateDer::pem_slice_iter(pem) {
                    let cert =
                        cert.with_context(|| format!("{tls}.clientCaFile: {ca_file} is not PEM"))?;
                    roots.add(cert).with_context(|| {
                        format!("{tls}.clientCaFile: a certificate in {ca_file}")
                    })?;
                }
                anyhow::ensure!(
                    !roots.is_empty(),
                    "{tls}.clientCaFile: {ca_file} holds no CERTIFICATE block"
                );
                let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .with_context(|| format!("{tls}.clientCaFile: {ca_file}"))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_single_cert(chain, key).with_context(|| {
            format!(
                "{tls}: the key in {} does not go with the certificate in {cert_file}",
                files.key_file.display()
            )
        })?;
        config.alpn_protocols = served.alpn().iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    }
}

/// The configuration in force and the files it follows.
#[derive(Debug)]
pub struct Reloader {
    files: TlsConfig,
    served: Served,
    last: Material,
    current: Arc<ArcSwap<ServerConfig>>,
}

/// What one [`Reloader::check`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Reload {
    /// The files are as last read: nothing to do.
    Unchanged,
    /// The files changed and the new configuration is in force.
    Reloaded,
    /// The files changed but make no valid configuration (the message says why); the previous
    /// one stays in force.
    Rejected(String),
}

impl Reloader {
    /// Reads and checks the files once; an error names the key and file at fault.
    pub fn load(files: &TlsConfig, served: Served) -> anyhow::Result<Self> {
        let material = Material::read(files, served)?;
        let config = material.server_config(files, served)?;
        Ok(Self {
            files: files.clone(),
            served,
            last: material,
            current: Arc::new(ArcSwap::new(config)),
        })
    }

    /// Reads the files again and swaps in the configuration they make if they changed.
    pub fn check(&mut self) -> Reload {
        let material = match Material::read(&self.files, self.served) {
            Ok(material) => material,
            Err(error) => return Reload::Rejected(format!("{error:#}")),
        };
        if material == self.last {
            return Reload::Unchanged;
        }
        let outcome = match material.server_config(&self.files, self.served) {
            Ok(config) => {
                self.current.store(config);
                Reload::Reloaded
            }
            Err(error) => Reload::Rejected(format!("{error:#}")),
        };
        // Rejected files are remembered too: they are reported once, not at every tick, and
        // the next change is tried afresh.
        self.last = material;
        outcome
    }

    /// The configuration in force, as handshakes read it.
    fn current(&self) -> Arc<ArcSwap<ServerConfig>> {
        self.current.clone()
    }

    /// Checks the files every `interval` until aborted, logging each reload and rejection.
    async fn run(mut self, interval: Duration) {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            match self.check() {
                Reload::Unchanged => {}
                Reload::Reloaded => info!(
                    cert = %self.files.cert_file.display(),
                    "TLS certificate files changed: new connections get the new certificate"
                ),
                Reload::Rejected(error) => warn!(
                    %error,
                    "TLS certificate files changed but cannot be used; the previous certificate \
                     stays in force"
                ),
            }
        }
    }
}

/// A TLS listener for `axum::serve`: accepts TCP connections, handshakes each in its own task
/// with the configuration in force, and yields the finished ones. Dropping it stops accepting
/// and stops the reload task.
#[derive(Debug)]
pub struct TlsListener {
    incoming: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    tasks: Vec<AbortHandle>,
}

impl TlsListener {
    /// Serves TLS on `tcp` with the files of `reloader`, checked again every `interval`.
    pub fn new(tcp: TcpListener, reloader: Reloader, interval: Duration) -> std::io::Result<Self> {
        let local = tcp.local_addr()?;
        let (tx, incoming) = mpsc::channel(ACCEPT_QUEUE);
        let current = reloader.current();
        let names = ClientNames::of(&reloader.files, reloader.served)
            .map_err(|error| std::io::Error::new(std::io::ErrorKind::InvalidInput, error))?;
        let accept = tokio::spawn(accept_loop(tcp, current, Arc::new(names), tx));
        let reload = tokio::spawn(reloader.run(interval));
        Ok(Self {
            incoming,
            local,
            tasks: vec![accept.abort_handle(), reload.abort_handle()],
        })
    }
}

impl TlsListener {
    /// The finished handshakes as a stream, for servers that take one (tonic's).
    pub fn into_stream(
        self,
    ) -> impl futures::Stream<Item = std::io::Result<TlsStream<TcpStream>>> + Send + 'static {
        futures::stream::unfold(self, |mut listener| async move {
            let (stream, _) = axum::serve::Listener::accept(&mut listener).await;
            Some((Ok(stream), listener))
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.incoming.recv().await {
            Some(connection) => connection,
            // The accept task ended: it only does when aborted, which happens when this
            // listener is dropped, so this is never reached while axum polls it.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// The names a client certificate must be valid for (`allowedClientNames`); empty: any the
/// CA signed.
#[derive(Debug)]
struct ClientNames {
    key: String,
    names: Vec<ServerName<'static>>,
}

impl ClientNames {
    fn of(files: &TlsConfig, served: Served) -> Result<Self, String> {
        let key = format!("{}.allowedClientNames", served.key());
        let names = files
            .allowed_client_names
            .iter()
            .map(|name| {
                ServerName::try_from(name.clone())
                    .map_err(|_| format!("{key}: {name:?} is neither a DNS name nor an IP address"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { key, names })
    }

    /// Why the client of `stream` is refused, if it is: its certificate is valid for none of
    /// the names. Without names, or without a client certificate (the verifier already
    /// decided whether one is required), nothing is refused here.
    fn refusal(&self, stream: &TlsStream<TcpStream>) -> Option<String> {
        if self.names.is_empty() {
            return None;
        }
        let Some(leaf) = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
        else {
            return Some(format!("no client certificate, and {} is set", self.key));
        };
        let certificate = match webpki::EndEntityCert::try_from(leaf) {
            Ok(certificate) => certificate,
            Err(error) => return Some(format!("the client certificate does not parse: {error}")),
        };
        let valid = self
            .names
            .iter()
            .any(|name| certificate.verify_is_valid_for_subject_name(name).is_ok());
        (!valid).then(|| format!("the client certificate is valid for none of {}", self.key))
    }
}

async fn accept_loop(
    tcp: TcpListener,
    current: Arc<ArcSwap<ServerConfig>>,
    names: Arc<ClientNames>,
    ready: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        // The permit first: past the cap, clients wait in the kernel's queue, not here.
        let Ok(permit) = Arc::clone(&handshakes).acquire_owned().await else {
            return; // Never: the semaphore is not closed.
        };
        let (mut socket, peer) = match tcp.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // As axum's own listener does: out of file descriptors and the like pass.
                warn!(%error, "accepting a TLS connection failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        crate::http::server::no_delay(&mut socket);
        let acceptor = TlsAcceptor::from(current.load_full());
        let ready = ready.clone();
        let names = Arc::clone(&names);
        tokio::spawn(async move {
            let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(socket)).await;
            // The handshake is over, whatever its outcome: the next client may start its own.
            drop(permit);
            match handshake {
                Ok(Ok(stream)) => {
                    if let Some(reason) = names.refusal(&stream) {
                        warn!(%peer, %reason, "TLS client refused");
                        return;
                    }
                    let protocol = stream
                        .get_ref()
                        .1
                        .alpn_protocol()
                        .map(String::from_utf8_lossy);
                    let protocol = protocol.as_deref().unwrap_or("none");
                    debug!(%peer, %protocol, "TLS handshake finished");
                    // Fails only when the listener is gone (shutting down).
                    let _ = ready.send((stream, peer)).await;
                }
                Ok(Err(error)) => debug!(%peer, %error, "TLS handshake failed"),
                Err(_) => debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;
    use std::path::PathBuf;

    struct Ca {
        issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
        pem: String,
    }

    fn ca() -> Ca {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        Ca {
            pem: cert.pem(),
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// A leaf for 127.0.0.1 signed by `ca`: (certificate PEM, key PEM, certificate DER).
    fn leaf(ca: &Ca) -> (String, String, Vec<u8>) {
        leaf_for(ca, "127.0.0.1")
    }

    /// A leaf for `name` signed by `ca`: (certificate PEM, key PEM, certificate DER).
    fn leaf_for(ca: &Ca, name: &str) -> (String, String, Vec<u8>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
        let cert = params.signed_by(&key, &ca.issuer).unwrap();
        (cert.pem(), key.serialize_pem(), cert.der().to_vec())
    }

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("gpu-extender-tls-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn files(dir: &Path) -> TlsConfig {
        TlsConfig {
            cert_file: dir.join("tls.crt"),
            key_file: dir.join("tls.key"),
            ..TlsConfig::default()
        }
    }

    /// A new client CA, written to `dir` and required of clients by `files`.
    fn require_client_certificates(dir: &Path, files: &mut TlsConfig) -> Ca {
        let client_ca = ca();
        let client_ca_file = dir.join("client-ca.crt");
        std::fs::write(&client_ca_file, &client_ca.pem).unwrap();
        files.client_ca_file = Some(client_ca_file);
        client_ca
    }

    fn write(files: &TlsConfig, cert: &str, key: &str) {
        std::fs::write(&files.cert_file, cert).unwrap();
        std::fs::write(&files.key_file, key).unwrap();
    }

    /// Serves `app` over TLS with `files` on a free loopback port, the files checked again every
    /// `interval`: the address and the server's task.
    async fn serve(
        files: &TlsConfig,
        interval: Duration,
        app: axum::Router,
    ) -> (SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>) {
        let reloader = Reloader::load(files, Served::Extender).unwrap();
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let listener = TlsListener::new(tcp, reloader, interval).unwrap();
        let addr = listener.local;
        (
            addr,
            tokio::spawn(async move { axum::serve(listener, app).await }),
        )
    }

    /// The certificate a fresh handshake with `addr` is served, trusting `ca`.
    async fn served_certificate(addr: SocketAddr, ca: &Ca) -> Vec<u8> {
        let (served, _) = exchange(addr, ca, None).await.unwrap();
        served
    }

    /// A GET over a fresh TLS connection to `addr`, trusting `ca`, presenting `client`
    /// (certificate and key PEM) when given: the certificate served and the answer's first line.
    async fn exchange(
        addr: SocketAddr,
        ca: &Ca,
        client: Option<(&str, &str)>,
    ) -> std::io::Result<(Vec<u8>, String)> {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut roots = RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca.pem.as_bytes()).unwrap())
            .unwrap();
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
        let config = match client {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => builder
                .with_client_auth_cert(
                    vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()],
                    PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
                )
                .unwrap(),
        };
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let socket = TcpStream::connect(addr).await?;
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let mut stream = connector.connect(name, socket).await?;
        let served = stream.get_ref().1.peer_certificates().unwrap()[0].to_vec();
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await?;
        let mut answer = Vec::new();
        match stream.read_to_end(&mut answer).await {
            Ok(_) => {}
            Err(error)
                if error.kind() == std::io::ErrorKind::UnexpectedEof && !answer.is_empty() => {}
            Err(error) => return Err(error),
        }
        let text = String::from_utf8_lossy(&answer);
        Ok((served, text.lines().next().unwrap_or_default().to_owned()))
    }

    #[tokio::test]
    async fn with_a_client_ca_only_clients_with_its_certificates_are_served() {
        let dir = scratch("mtls");
        let mut files = files(&dir);
        let ca = ca();
        let (cert, key, _) = leaf(&ca);
        write(&files, &cert, &key);
        let client_ca = require_client_certificates(&dir, &mut files);
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let (addr, server) = serve(&files, Duration::from_secs(3600), app).await;

        let (client_cert, client_key, _) = leaf(&client_ca);
        let (_, status) = exchange(addr, &ca, Some((&client_cert, &client_key)))
            .await
            .unwrap();
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert!(
            exchange(addr, &ca, None).await.is_err(),
            "no client certificate"
        );
        // A certificate of another CA (the serving one) is refused too.
        let (other_cert, other_key, _) = leaf(&ca);
        assert!(
            exchange(addr, &ca, Some((&other_cert, &other_key)))
                .await
                .is_err(),
            "a client certificate of another CA"
        );
        server.abort();
        std::fs::remove_dir_all(&dir).ok();
    }

    #[tokio::test]
    async fn a_rotated_certificate_is_served_to_new_connections_without_a_restart() {
        let dir = scratch("rotate");
        let files = files(&dir);
        let ca = ca();
        let (cert_a, key_a, der_a) = leaf(&ca);
        write(&files, &cert_a, &key_a);
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let (addr, server) = serve(&files, Duration::from_millis(20), app).await;

        assert_eq!(served_certificate(addr, &ca).await, der_a);
        let (cert_b, key_b, der_b) = leaf(&ca);
        assert_ne!(der_a, der_b);
        write(&files, &cert_b, &key_b);
        // The reload task swaps the configuration at its next tick; handshakes until then may
        // still get the old certificate, none gets anything else.
        let mut served = served_certificate(addr, &ca).await;
        for _ in 0..500 {
            if served == der_b {
                break;
            }
            assert_eq!(served, der_a);
            tokio::time::sleep(Duration::from_millis(20)).await;
            served = served_certificate(addr, &ca).await;
        }
        assert_eq!(served, der_b, "the rotated certificate was never served");
        server.abort();
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_half_written_rotation_keeps_the_previous_certificate_until_the_key_follows() {
        let dir = scratch("half");
        let files = files(&dir);
        let ca = ca();
        let (cert_a, key_a, _) = leaf(&ca);
        write(&files, &cert_a, &key_a);
        let mut reloader = Reloader::load(&files, Served::Extender).unwrap();
        let before = reloader.current().load_full();
        assert_eq!(reloader.check(), Reload::Unchanged);

        // The new certificate lands before its key: rejected, the old configuration stays.
        let (cert_b, key_b, _) = leaf(&ca);
        std::fs::write(&files.cert_file, &cert_b).unwrap();
        let Reload::Rejected(message) = reloader.check() else {
            panic!("a certificate without its key was accepted")
        };
        assert!(
            message.contains("does not go with the certificate"),
            "{message}"
        );
        assert!(Arc::ptr_eq(&before, &reloader.current().load_full()));
        // Reported once, not at every tick.
        assert_eq!(reloader.check(), Reload::Unchanged);

        std::fs::write(&files.key_file, &key_b).unwrap();
        assert_eq!(reloader.check(), Reload::Reloaded);
        assert!(!Arc::ptr_eq(&before, &reloader.current().load_full()));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[tokio::test]
    async fn clients_that_stall_their_handshake_hold_up_no_other() {
        let dir = scratch("stall");
        let files = files(&dir);
        let ca = ca();
        let (cert, key, _) = leaf(&ca);
        write(&files, &cert, &key);
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let (addr, server) = serve(&files, Duration::from_secs(3600), app).await;
        // Connections that never send a ClientHello.
        let mut stalled = Vec::new();
        for _ in 0..100 {
            stalled.push(TcpStream::connect(addr).await.unwrap());
        }
        let (_, status) = exchange(addr, &ca, None).await.unwrap();
        assert_eq!(status, "HTTP/1.1 200 OK");
        drop(stalled);
        server.abort();
        std::fs::remove_dir_all(&dir).ok();
    }

    #[tokio::test]
    async fn pinned_client_names_refuse_other_certificates_of_the_same_ca() {
        let dir = scratch("pinned");
        let mut files = files(&dir);
        let ca = ca();
        let (cert, key, _) = leaf(&ca);
        write(&files, &cert, &key);
        let client_ca = require_client_certificates(&dir, &mut files);
        files.allowed_client_names = vec!["kube-scheduler.gpu-extender.svc".to_owned()];
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let (addr, server) = serve(&files, Duration::from_secs(3600), app).await;

        let (pinned_cert, pinned_key, _) = leaf_for(&client_ca, "kube-scheduler.gpu-extender.svc");
        let (_, status) = exchange(addr, &ca, Some((&pinned_cert, &pinned_key)))
            .await
            .unwrap();
        assert_eq!(status, "HTTP/1.1 200 OK");
        // Signed by the same CA, for another name: the handshake passes the CA check, then the
        // connection is closed unanswered.
        let (other_cert, other_key, _) = leaf_for(&client_ca, "someone-else.default.svc");
        let refused = exchange(addr, &ca, Some((&other_cert, &other_key))).await;
        assert!(
            refused.as_ref().is_err() || refused.as_ref().is_ok_and(|(_, line)| line.is_empty()),
            "another name of the same CA was answered: {refused:?}"
        );
        server.abort();
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn each_listener_offers_its_protocol_and_names_its_keys() {
        let dir = scratch("served");
        let files = files(&dir);
        let missing = Reloader::load(&files, Served::Estimator).unwrap_err();
        assert!(
            format!("{missing:#}").starts_with("estimator.tls.certFile: cannot read"),
            "{missing:#}"
        );
        let ca = ca();
        let (cert, key, _) = leaf(&ca);
        write(&files, &cert, &key);
        for (served, protocols) in [
            (Served::Extender, vec![b"h2".to_vec(), b"http/1.1".to_vec()]),
            (Served::Estimator, vec![b"h2".to_vec()]),
            (Served::Admin, vec![b"h2".to_vec(), b"http/1.1".to_vec()]),
            (Served::Webhook, vec![b"h2".to_vec(), b"http/1.1".to_vec()]),
        ] {
            let reloader = Reloader::load(&files, served).unwrap();
            assert_eq!(reloader.current().load().alpn_protocols, protocols);
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    /// A TLS connection to `addr` offering `protocols` in ALPN, trusting `ca`: the stream and
    /// the protocol the server chose.
    async fn connect_offering(
        addr: SocketAddr,
        ca: &Ca,
        protocols: &[&[u8]],
    ) -> (tokio_rustls::client::TlsStream<TcpStream>, Option<Vec<u8>>) {
        let mut roots = RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca.pem.as_bytes()).unwrap())
            .unwrap();
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = protocols.iter().map(|p| p.to_vec()).collect();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let socket = TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let stream = connector.connect(name, socket).await.unwrap();
        let chosen = stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
        (stream, chosen)
    }

    /// A route that answers the HTTP version its request came in.
    fn version_echo() -> axum::Router {
        axum::Router::new().route(
            "/",
            axum::routing::post(|request: axum::extract::Request| async move {
                format!("{:?}", request.version())
            }),
        )
    }

    /// Three calls in flight together over one HTTP/2 connection on `io` (as a bind beside the
    /// next pod's filter), to [`version_echo`]: the versions answered.
    async fn versions_over_http2<T>(io: T, addr: SocketAddr) -> Vec<String>
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        use http_body_util::BodyExt as _;
        let (sender, connection) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(io),
        )
        .await
        .unwrap();
        tokio::spawn(connection);
        let calls = (0..3).map(|_| {
            let mut sender = sender.clone();
            async move {
                let request = hyper::Request::post(format!("http://{addr}/"))
                    .body(http_body_util::Full::new(axum::body::Bytes::from_static(
                        b"{}",
                    )))
                    .unwrap();
                let answer = sender.send_request(request).await.unwrap();
                assert_eq!(answer.status(), 200);
                let body = answer.into_body().collect().await.unwrap().to_bytes();
                String::from_utf8_lossy(&body).into_owned()
            }
        });
        futures::future::join_all(calls).await
    }

    /// The plain listener (no `server.tls`), as `serve` runs it: HTTP/2 from a client that starts
    /// with it (prior knowledge), HTTP/1.1 otherwise.
    #[tokio::test]
    async fn the_plain_listener_answers_http2_with_prior_knowledge() {
        use axum::serve::ListenerExt as _;
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let listener = tcp.tap_io(crate::http::server::no_delay);
        let server = tokio::spawn(async move { axum::serve(listener, version_echo()).await });
        let socket = TcpStream::connect(addr).await.unwrap();
        for version in versions_over_http2(socket, addr).await {
            assert_eq!(version, "HTTP/2.0");
        }
        server.abort();
    }

    #[tokio::test]
    async fn the_extender_listener_serves_many_calls_over_one_http2_connection() {
        let dir = scratch("h2");
        let files = files(&dir);
        let ca = ca();
        let (cert, key, _) = leaf(&ca);
        write(&files, &cert, &key);
        let (addr, server) = serve(&files, Duration::from_secs(3600), version_echo()).await;

        // Go's transport, as kube-scheduler's extender client has it, offers both.
        let (stream, chosen) = connect_offering(addr, &ca, &[b"h2", b"http/1.1"]).await;
        assert_eq!(chosen.as_deref(), Some(&b"h2"[..]));
        for version in versions_over_http2(stream, addr).await {
            assert_eq!(version, "HTTP/2.0");
        }

        // A client that offers only HTTP/1.1 (or nothing: `exchange`) gets HTTP/1.1.
        let (_, chosen) = connect_offering(addr, &ca, &[b"http/1.1"]).await;
        assert_eq!(chosen.as_deref(), Some(&b"http/1.1"[..]));
        let (_, status) = exchange(addr, &ca, None).await.unwrap();
        assert_eq!(status, "HTTP/1.1 405 Method Not Allowed");
        server.abort();
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn bad_files_at_start_name_the_key_and_the_file() {
        let dir = scratch("bad");
        let files = files(&dir);
        let missing = Reloader::load(&files, Served::Extender).unwrap_err();
        assert!(
            format!("{missing:#}").starts_with("server.tls.certFile: cannot read"),
            "{missing:#}"
        );
        write(&files, "not a certificate", "not a key");
        let garbage = format!(
            "{:#}",
            Reloader::load(&files, Served::Extender).unwrap_err()
        );
        assert!(garbage.contains("server.tls.certFile"), "{garbage}");
        assert!(garbage.contains("tls.crt"), "{garbage}");
        let ca = ca();
        let (cert, _, _) = leaf(&ca);
        write(&files, &cert, "not a key");
        let no_key = format!(
            "{:#}",
            Reloader::load(&files, Served::Extender).unwrap_err()
        );
        assert!(no_key.starts_with("server.tls.keyFile"), "{no_key}");
        let with_ca = TlsConfig {
            client_ca_file: Some(dir.join("missing-ca.crt")),
            ..files.clone()
        };
        let (cert, key, _) = leaf(&ca);
        write(&files, &cert, &key);
        let no_ca = format!(
            "{:#}",
            Reloader::load(&with_ca, Served::Extender).unwrap_err()
        );
        assert!(no_ca.starts_with("server.tls.clientCaFile"), "{no_ca}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
