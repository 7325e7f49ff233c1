//! The extender listener over HTTPS (`server.tls`): a real kube-scheduler calls it through its
//! extender `tlsConfig` (the serving CA in `caFile`, a client certificate that
//! `server.tls.clientCaFile` requires) and pods land; certificate files rotated under the running
//! extender are served to the next handshake without a restart, and kube-scheduler keeps binding.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::BIND;
use crate::harness::{PROFILE_CONFIG, http_post_json};
use crate::objects::{GPU_MEM, GpuNode, Mode, PodSpec, create_bound, create_nodes};
use crate::record::record_of;

/// A throwaway certificate authority (also the Karmada estimator's TLS scenario's).
pub(crate) struct Ca {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pub(crate) pem: String,
}

impl Ca {
    pub(crate) fn new(name: &str) -> Result<Self> {
        let key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key)?;
        Ok(Self {
            pem: cert.pem(),
            issuer: rcgen::Issuer::new(params, key),
        })
    }

    /// A leaf for `names` with `usage`: (certificate PEM, key PEM, certificate DER).
    pub(crate) fn leaf(
        &self,
        names: &[&str],
        usage: rcgen::ExtendedKeyUsagePurpose,
    ) -> Result<(String, String, Vec<u8>)> {
        let key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(
            names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>(),
        )?;
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem(), cert.der().to_vec()))
    }
}

pub(crate) fn write(path: &Path, text: &str) -> Result<PathBuf> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path.to_owned())
}

/// One request on a fresh TLS connection to `addr`, trusting `ca_pem`, presenting `client`
/// (certificate and key PEM) when given: the certificate the server presented and the answer's
/// status line.
fn https_request(
    addr: SocketAddr,
    ca_pem: &str,
    client: Option<(&str, &str)>,
) -> Result<(Vec<u8>, String)> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca_pem.as_bytes())?)?;
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder.with_client_auth_cert(
            vec![CertificateDer::from_pem_slice(cert.as_bytes())?],
            PrivateKeyDer::from_pem_slice(key.as_bytes())?,
        )?,
    };
    let socket = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    socket.set_read_timeout(Some(Duration::from_secs(5)))?;
    let name = ServerName::try_from(addr.ip().to_string())?;
    let connection = rustls::ClientConnection::new(Arc::new(config), name)?;
    let mut tls = rustls::StreamOwned::new(connection, socket);
    // A GET on a verb answers 405: any HTTP answer shows the session carries requests.
    write!(
        tls,
        "GET /scheduler/filter HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    tls.flush()?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match tls.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
            // The server closing without close_notify after its answer.
            Err(error)
                if error.kind() == std::io::ErrorKind::UnexpectedEof && !answer.is_empty() =>
            {
                break;
            }
            Err(error) => return Err(error.into()),
        }
    }
    let served = tls
        .conn
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|cert| cert.to_vec())
        .ok_or_else(|| anyhow!("the server presented no certificate"))?;
    let text = String::from_utf8_lossy(&answer);
    let status = text.lines().next().unwrap_or_default().to_owned();
    Ok((served, status))
}

async fn https(
    addr: SocketAddr,
    ca_pem: &str,
    client: Option<(&str, &str)>,
) -> Result<(Vec<u8>, String)> {
    let ca_pem = ca_pem.to_owned();
    let client = client.map(|(c, k)| (c.to_owned(), k.to_owned()));
    tokio::task::spawn_blocking(move || {
        https_request(
            addr,
            &ca_pem,
            client.as_ref().map(|(c, k)| (c.as_str(), k.as_str())),
        )
    })
    .await
    .context("https task")?
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn kube_scheduler_calls_the_extender_over_https_and_a_rotated_certificate_needs_no_restart() {
    crate::harness::run("tls", async |c| {
        let pki = c.dir.join("extender-pki");
        std::fs::create_dir_all(&pki)?;
        let serving_ca = Ca::new("gpu-extender serving CA")?;
        let client_ca = Ca::new("kube-scheduler client CA")?;
        let server_auth = || rcgen::ExtendedKeyUsagePurpose::ServerAuth;
        let (cert_a, key_a, der_a) = serving_ca.leaf(&["127.0.0.1", "localhost"], server_auth())?;
        let (client_cert, client_key, _) = client_ca.leaf(
            &["kube-scheduler"],
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        )?;
        let cert_file = write(&pki.join("tls.crt"), &cert_a)?;
        let key_file = write(&pki.join("tls.key"), &key_a)?;
        let ca_file = write(&pki.join("ca.crt"), &serving_ca.pem)?;
        let client_ca_file = write(&pki.join("client-ca.crt"), &client_ca.pem)?;
        let client_cert_file = write(&pki.join("client.crt"), &client_cert)?;
        let client_key_file = write(&pki.join("client.key"), &client_key)?;

        create_nodes(
            &c.client,
            &[GpuNode::new("t4", Mode::Share, 4, "Tesla-T4", 16)],
        )
        .await?;
        c.start_extender(&format!(
            "server:\n  tls:\n    certFile: {}\n    keyFile: {}\n    clientCaFile: {}\n    \
             reloadIntervalSeconds: 1\n",
            cert_file.display(),
            key_file.display(),
            client_ca_file.display()
        ))
        .await?;
        let addr = c.extender_addr;
        let client = Some((client_cert.as_str(), client_key.as_str()));

        // The listener speaks TLS only, and only to clients with a certificate of the client CA.
        let (served, status) = https(addr, &serving_ca.pem, client).await?;
        ensure!(served == der_a, "the extender served another certificate");
        ensure!(
            status.contains(" 405 "),
            "a GET on a verb answered {status:?}"
        );
        match https(addr, &serving_ca.pem, None).await {
            Err(_) => {}
            Ok((_, status)) => bail!("a client without a certificate was answered {status:?}"),
        }
        let plain = http_post_json(addr, "/scheduler/filter", &serde_json::json!({})).await;
        ensure!(
            !matches!(plain, Ok((200, _))),
            "plain HTTP was served on the TLS listener: {plain:?}"
        );

        // kube-scheduler over https, trusting the serving CA, with its client certificate.
        let url = format!("https://{addr}/scheduler");
        let rendered = c.rendered_scheduler_config(PROFILE_CONFIG, &url)?;
        let mut config: serde_yaml_ng::Value = serde_yaml_ng::from_str(&rendered)?;
        let extender = config
            .get_mut("extenders")
            .and_then(|e| e.get_mut(0))
            .and_then(|e| e.as_mapping_mut())
            .ok_or_else(|| anyhow!("{PROFILE_CONFIG} has no extender"))?;
        extender.insert("enableHTTPS".into(), true.into());
        let mut tls = serde_yaml_ng::Mapping::new();
        for (key, path) in [
            ("caFile", &ca_file),
            ("certFile", &client_cert_file),
            ("keyFile", &client_key_file),
        ] {
            tls.insert(key.into(), path.display().to_string().into());
        }
        extender.insert("tlsConfig".into(), tls.into());
        c.start_scheduler_rendered(PROFILE_CONFIG, &serde_yaml_ng::to_string(&config)?, &[])
            .await?;

        let pod = create_bound(&c.client, &PodSpec::new("over-https", GPU_MEM, 2), BIND).await?;
        let record = record_of(&pod)?;
        eprintln!(
            "  over-https: bound through the extender over TLS to {} GPU {:?}",
            record.node,
            record.all_gpus()
        );
        // kube-scheduler's extender client (Go's transport, configured for HTTP/2 by
        // client-go) chose HTTP/2 in the handshake: its filter and bind calls share a
        // connection instead of opening and handshaking new ones. The test's own clients offer
        // no ALPN ("protocol=none").
        let handshake = ["TLS handshake finished", "protocol=h2"];
        let over_h2 = c.log_count("extender.log", &handshake);
        ensure!(
            over_h2 >= 1,
            "kube-scheduler did not choose HTTP/2 in any handshake with the extender"
        );
        eprintln!("  kube-scheduler's calls came over {over_h2} HTTP/2 connection(s)");

        // Rotate: a new certificate and key of the same CA, written over the old files.
        let (cert_b, key_b, der_b) = serving_ca.leaf(&["127.0.0.1", "localhost"], server_auth())?;
        ensure!(der_a != der_b, "rcgen made the same certificate twice");
        write(&key_file, &key_b)?;
        write(&cert_file, &cert_b)?;
        let rotated = Instant::now();
        let deadline = rotated + Duration::from_secs(30);
        loop {
            let (served, status) = https(addr, &serving_ca.pem, client).await?;
            ensure!(
                status.contains(" 405 "),
                "a GET on a verb answered {status:?}"
            );
            if served == der_b {
                break;
            }
            ensure!(served == der_a, "the extender served neither certificate");
            ensure!(
                Instant::now() < deadline,
                "the rotated certificate was not served within 30s"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        eprintln!(
            "  the rotated certificate served {:.1}s after the files changed, no restart",
            rotated.elapsed().as_secs_f64()
        );

        // kube-scheduler restarted (its pooled connections gone, the extender untouched)
        // handshakes with the new certificate and goes on scheduling through the extender.
        c.start_scheduler_rendered(PROFILE_CONFIG, &serde_yaml_ng::to_string(&config)?, &[])
            .await?;
        let pod =
            create_bound(&c.client, &PodSpec::new("after-rotation", GPU_MEM, 2), BIND).await?;
        let record = record_of(&pod)?;
        eprintln!(
            "  after-rotation: bound through the extender to {} GPU {:?}",
            record.node,
            record.all_gpus()
        );
        Ok(())
    });
}
