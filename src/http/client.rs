//! The HTTP(S) client the operator commands read a running extender's admin surface with
//! (`inspect --from URL`, the replay's readiness wait): hyper's pooled client with rustls,
//! bounded in time and size, every error naming the URL.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use http_body_util::{BodyExt as _, Empty, LengthLimitError, Limited};
use hyper::body::Bytes;
use hyper::header::{ACCEPT, AUTHORIZATION};
use hyper::http::uri::{PathAndQuery, Scheme};
use hyper::{Request, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connect, HttpConnector};
use hyper_util::rt::TokioExecutor;

use crate::inspect::ClusterReport;

/// How long `--from` waits for a connection (TCP, and the TLS handshake for https), and for the
/// whole exchange: a server that accepts and then never answers must not hang the command.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest response `--from` reads: a report is kilobytes per node; the cap keeps a wrong URL
/// from filling memory.
const MAX_RESPONSE_BYTES: usize = 256 * 1024 * 1024;

/// The bounds of one GET; the tests shrink them.
#[derive(Clone, Copy, Debug)]
struct Limits {
    connect: Duration,
    request: Duration,
    max_bytes: usize,
}

const LIMITS: Limits = Limits {
    connect: CONNECT_TIMEOUT,
    request: REQUEST_TIMEOUT,
    max_bytes: MAX_RESPONSE_BYTES,
};

/// GETs an extender's `/inspect` and decodes it.
pub async fn fetch_report(url: &str) -> anyhow::Result<ClusterReport> {
    fetch_report_as(url, None).await
}

/// [`fetch_report`] sending `token` as `Authorization: Bearer` (the admin listener guards
/// `/inspect` by default, `server.adminAuth.paths`).
pub async fn fetch_report_as(url: &str, token: Option<&str>) -> anyhow::Result<ClusterReport> {
    let body = http_get_as(url, token).await?;
    serde_json::from_str(&body).with_context(|| format!("{url}: not an inspection report"))
}

/// GETs `url` (http://, or https:// verified against the system's root certificates; `/inspect`
/// when the URL has no path) and returns the body of a 200 answer; anything else is an error
/// naming the URL.
pub async fn http_get(url: &str) -> anyhow::Result<String> {
    http_get_as(url, None).await
}

/// [`http_get`] with `token` sent as `Authorization: Bearer`.
async fn http_get_as(url: &str, token: Option<&str>) -> anyhow::Result<String> {
    let uri = target(url)?;
    let tls = if uri.scheme() == Some(&Scheme::HTTPS) {
        Some(system_tls(url)?)
    } else {
        None
    };
    get(url, uri, tls, token, LIMITS).await
}

/// The URI to request: only http and https, with a host; `/inspect` when no path is given.
fn target(url: &str) -> anyhow::Result<Uri> {
    let supported = url.split_once("://").filter(|(scheme, _)| {
        scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")
    });
    let Some((_, rest)) = supported else {
        bail!("{url}: only http:// and https:// URLs are supported, e.g. http://127.0.0.1:9090");
    };
    // `http::Uri` refuses an empty authority ("http:///inspect") as malformed; say what is
    // missing instead.
    if rest.is_empty() || rest.starts_with(['/', '?', '#']) {
        bail!("{url}: no host");
    }
    let uri: Uri = url
        .parse()
        .with_context(|| format!("{url}: not a valid URL"))?;
    let scheme = uri
        .scheme()
        .cloned()
        .ok_or_else(|| anyhow!("{url}: not a valid URL"))?;
    let authority = uri
        .authority()
        .filter(|a| !a.host().is_empty())
        .cloned()
        .ok_or_else(|| anyhow!("{url}: no host"))?;
    let path = match uri.path_and_query().map(PathAndQuery::as_str) {
        None | Some("" | "/") => "/inspect",
        Some(path) => path,
    };
    Uri::builder()
        .scheme(scheme)
        .authority(authority)
        .path_and_query(path)
        .build()
        .with_context(|| format!("{url}: not a valid URL"))
}

/// TLS with the system's root certificates and rustls's ring provider, named here rather than
/// left to rustls's process-wide default, which it picks by itself only while ring is the one
/// provider compiled in.
fn system_tls(url: &str) -> anyhow::Result<rustls::ClientConfig> {
    use hyper_rustls::ConfigBuilderExt as _;
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .context("setting up TLS")?
    .with_native_roots()
    .with_context(|| format!("{url}: cannot load the system's root certificates"))?
    .with_no_client_auth())
}

/// One GET of `uri` within `limits`; TLS with `tls` when given (the https case).
async fn get(
    url: &str,
    uri: Uri,
    tls: Option<rustls::ClientConfig>,
    token: Option<&str>,
    limits: Limits,
) -> anyhow::Result<String> {
    let mut request = Request::get(uri).header(ACCEPT, "application/json");
    if let Some(token) = token {
        request = request.header(AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .with_context(|| format!("{url}: building the request"))?;
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(limits.connect));
    let exchange = async {
        match tls {
            None => send(url, client(http), request, limits.max_bytes).await,
            Some(config) => {
                // The TLS connector hands https URIs to the TCP connector, which by default
                // accepts only http ones.
                http.enforce_http(false);
                let https = hyper_rustls::HttpsConnectorBuilder::new()
                    .with_tls_config(config)
                    .https_only()
                    .enable_http1()
                    .wrap_connector(http);
                send(url, client(https), request, limits.max_bytes).await
            }
        }
    };
    tokio::time::timeout(limits.request, exchange)
        .await
        .map_err(|_| {
            anyhow!(
                "{url}: no complete answer within {} s",
                limits.request.as_secs_f64()
            )
        })?
}

/// A client for one request: it keeps no idle connection (nor the task that would hold it)
/// once the answer is read.
fn client<C>(connector: C) -> Client<C, Empty<Bytes>>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(connector)
}

/// Sends `request` and reads the answer, at most `max_bytes` of body.
async fn send<C>(
    url: &str,
    client: Client<C, Empty<Bytes>>,
    request: Request<Empty<Bytes>>,
    max_bytes: usize,
) -> anyhow::Result<String>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    let response = client.request(request).await.map_err(|error| {
        let what = if error.is_connect() {
            "cannot connect"
        } else {
            "no valid HTTP answer"
        };
        anyhow::Error::new(error).context(format!("{url}: {what}"))
    })?;
    let status = response.status();
    let body = Limited::new(response.into_body(), max_bytes)
        .collect()
        .await
        .map_err(|error| {
            if error.is::<LengthLimitError>() {
                let cap = if max_bytes.is_multiple_of(1 << 20) {
                    format!("{} MiB", max_bytes >> 20)
                } else {
                    format!("{max_bytes} bytes")
                };
                anyhow!("{url}: the response is larger than {cap}")
            } else {
                anyhow!("{url}: reading the response: {error}")
            }
        })?
        .to_bytes();
    let body = String::from_utf8_lossy(&body).into_owned();
    if status != StatusCode::OK {
        let snippet: String = body.chars().take(200).collect();
        bail!("{url}: HTTP {}: {snippet}", status.as_u16());
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::sync::mpsc;

    use super::*;

    /// Reads a request head (up to the blank line); the fake servers answer after it.
    fn read_head(stream: &mut impl Read) -> String {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            let read = stream.read(&mut byte).unwrap();
            assert_eq!(read, 1, "the client closed before the end of its request");
            head.push(byte[0]);
        }
        String::from_utf8(head).unwrap()
    }

    /// A one-connection plain HTTP server that answers with `response` and returns the request
    /// head it read.
    fn serve_once(response: String) -> (String, std::thread::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut socket, _) = listener.accept().unwrap();
            let request = read_head(&mut socket);
            socket.write_all(response.as_bytes()).unwrap();
            request
        });
        (format!("http://{address}"), server)
    }

    fn report_json() -> String {
        serde_json::to_string(&ClusterReport::default()).unwrap()
    }

    #[tokio::test]
    async fn unsupported_or_unreachable_urls_are_clear_errors() {
        for url in [
            "ftp://example.invalid",
            "127.0.0.1:9090",
            "example.invalid/inspect",
        ] {
            let error = fetch_report(url).await.unwrap_err().to_string();
            assert!(error.contains("only http:// and https://"), "{error}");
            assert!(error.starts_with(url), "{error}");
        }
        for url in ["http:///inspect", "http://", "HTTPS://"] {
            let error = fetch_report(url).await.unwrap_err().to_string();
            assert!(error.contains("no host"), "{error}");
        }
        // Port 1 on loopback: nothing listens there.
        let error = format!(
            "{:#}",
            fetch_report("http://127.0.0.1:1").await.unwrap_err()
        );
        assert!(
            error.contains("http://127.0.0.1:1: cannot connect"),
            "{error}"
        );
    }

    #[test]
    fn the_path_defaults_to_inspect_and_is_kept_otherwise() {
        let path = |url| target(url).unwrap().path_and_query().unwrap().to_string();
        assert_eq!(path("http://h:9090"), "/inspect");
        assert_eq!(path("http://h:9090/"), "/inspect");
        assert_eq!(path("https://h/readyz"), "/readyz");
        assert_eq!(path("http://h/inspect?x=1"), "/inspect?x=1");
    }

    #[tokio::test]
    async fn reads_a_report_from_an_http_1_0_server_that_closes() {
        let body = report_json();
        let (url, server) = serve_once(format!(
            "HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{body}"
        ));
        let report = fetch_report(&url).await.unwrap();
        assert_eq!(report, ClusterReport::default());
        let request = server.join().unwrap();
        assert!(
            request.starts_with("GET /inspect HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(
            !request.to_ascii_lowercase().contains("authorization"),
            "{request}"
        );
        assert!(
            request
                .to_ascii_lowercase()
                .contains("\r\nhost: 127.0.0.1:"),
            "{request}"
        );
    }

    #[tokio::test]
    async fn a_token_is_sent_as_a_bearer_authorization() {
        let body = report_json();
        let (url, server) = serve_once(format!(
            "HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{body}"
        ));
        fetch_report_as(&url, Some("t0ken")).await.unwrap();
        let request = server.join().unwrap();
        assert!(
            request
                .to_ascii_lowercase()
                .contains("\r\nauthorization: bearer t0ken\r\n"),
            "{request}"
        );
    }

    /// What the hand-written HTTP/1.0 client could not read: a chunked body on a connection the
    /// server keeps open. The server holds the socket until the client has its answer.
    #[tokio::test]
    async fn reads_a_chunked_answer_on_a_kept_alive_connection() {
        let body = report_json();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let (done, wait) = mpsc::channel::<()>();
        let server = std::thread::spawn(move || {
            let (mut socket, _) = listener.accept().unwrap();
            read_head(&mut socket);
            let (first, second) = body.split_at(body.len() / 2);
            let mut answer = String::from(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
            );
            for chunk in [first, second] {
                answer.push_str(&format!("{:x}\r\n{chunk}\r\n", chunk.len()));
            }
            answer.push_str("0\r\n\r\n");
            socket.write_all(answer.as_bytes()).unwrap();
            // Keep the connection open: the answer must be complete without the close.
            wait.recv().unwrap();
        });
        let report = fetch_report(&format!("http://{address}")).await;
        done.send(()).unwrap();
        server.join().unwrap();
        assert_eq!(report.unwrap(), ClusterReport::default());
    }

    #[tokio::test]
    async fn non_200_answers_and_non_json_bodies_are_errors_naming_the_url() {
        let (url, server) = serve_once(
            "HTTP/1.1 404 Not Found\r\nContent-Length: 13\r\n\r\nno such page\n".to_owned(),
        );
        let error = fetch_report(&url).await.unwrap_err().to_string();
        server.join().unwrap();
        assert!(error.starts_with(&url), "{error}");
        assert!(error.contains("HTTP 404: no such page"), "{error}");

        let (url, server) =
            serve_once("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello".to_owned());
        let error = fetch_report(&url).await.unwrap_err().to_string();
        server.join().unwrap();
        assert_eq!(error, format!("{url}: not an inspection report"));

        let (url, server) = serve_once("not HTTP at all\r\n\r\n".to_owned());
        let error = format!("{:#}", fetch_report(&url).await.unwrap_err());
        server.join().unwrap();
        assert!(
            error.starts_with(&format!("{url}: no valid HTTP answer")),
            "{error}"
        );
    }

    #[tokio::test]
    async fn the_response_size_and_the_wait_are_bounded() {
        let small = Limits {
            max_bytes: 100,
            ..LIMITS
        };
        let (url, server) = serve_once(format!(
            "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{}",
            "x".repeat(1000)
        ));
        let error = get(&url, target(&url).unwrap(), None, None, small)
            .await
            .unwrap_err()
            .to_string();
        server.join().unwrap();
        assert_eq!(
            error,
            format!("{url}: the response is larger than 100 bytes")
        );

        // A server that accepts and never answers.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let quick = Limits {
            request: Duration::from_millis(300),
            ..LIMITS
        };
        let error = get(&url, target(&url).unwrap(), None, None, quick)
            .await
            .unwrap_err()
            .to_string();
        assert_eq!(error, format!("{url}: no complete answer within 0.3 s"));
        drop(listener);
    }

    /// https against a local TLS server with a throwaway certificate: read when the certificate
    /// is trusted, refused with the system's roots (which do not hold it).
    #[tokio::test]
    async fn reads_a_report_over_https_and_refuses_an_untrusted_certificate() {
        let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
        let certificate = certified.cert.der().clone();
        let key = rustls::pki_types::PrivateKeyDer::from(certified.signing_key);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server_config = Arc::new(
            rustls::ServerConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![certificate.clone()], key)
                .unwrap(),
        );
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        let body = report_json();
        // Two connections: the trusting client's, then the one with the system's roots, whose
        // handshake fails.
        let server = std::thread::spawn(move || {
            let (socket, _) = listener.accept().unwrap();
            let connection = rustls::ServerConnection::new(server_config.clone()).unwrap();
            let mut tls = rustls::StreamOwned::new(connection, socket);
            let request = read_head(&mut tls);
            write!(
                tls,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            tls.flush().unwrap();
            let (socket, _) = listener.accept().unwrap();
            let connection = rustls::ServerConnection::new(server_config).unwrap();
            let mut tls = rustls::StreamOwned::new(connection, socket);
            let mut rest = Vec::new();
            let refused = tls.read_to_end(&mut rest).is_err();
            (request, refused)
        });

        let mut roots = rustls::RootCertStore::empty();
        roots.add(certificate).unwrap();
        let trusting = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let body = get(&url, target(&url).unwrap(), Some(trusting), None, LIMITS)
            .await
            .unwrap();
        assert_eq!(
            serde_json::from_str::<ClusterReport>(&body).unwrap(),
            ClusterReport::default()
        );

        let error = format!("{:#}", fetch_report(&url).await.unwrap_err());
        let (request, refused) = server.join().unwrap();
        assert!(
            request.starts_with("GET /inspect HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(refused, "the server saw no failed handshake");
        assert!(error.starts_with(&format!("{url}: ")), "{error}");
        assert!(error.to_lowercase().contains("certificate"), "{error}");
    }
}
