//! The command line as a user meets it: the built binary run with bad and good arguments, its
//! help, its messages and what it leaves on disk. `inspect` and `explain` read a stand-in API
//! server (a loopback HTTP listener answering the three reads they make), so no control plane is
//! needed.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed setup step should stop the test with its message"
)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gpu_engine::ScoringPolicy;
use gpu_extender::config::Config;
use gpu_test_support::cli::{self, stderr, stdout};

const BIN: &str = env!("CARGO_BIN_EXE_gpu-extender");

fn command(dir: &Path, args: &[&str]) -> Command {
    cli::command(BIN, dir, args)
}

fn run(args: &[&str]) -> Output {
    cli::run(BIN, args).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    cli::scratch(name).unwrap()
}

fn flags_of(command: &str) -> Vec<String> {
    let help = stdout(&run(&[command, "--help"]));
    help.lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let line = line.strip_prefix("-o, ").unwrap_or(line);
            line.starts_with("--")
                .then(|| line.split([' ', ',']).next().unwrap_or_default().to_owned())
        })
        .collect()
}

const SERVE_ONLY: [&str; 4] = ["--listen", "--admin-listen", "--url-prefix", "--gpushare"];

#[test]
fn only_serve_lists_the_serve_flags() {
    let serve = flags_of("serve");
    for flag in SERVE_ONLY {
        assert!(
            serve.contains(&flag.to_owned()),
            "serve lacks {flag}: {serve:?}"
        );
    }
    for command in ["inspect", "explain", "check-config"] {
        let flags = flags_of(command);
        assert!(flags.contains(&"--set".to_owned()), "{command}: {flags:?}");
        for flag in SERVE_ONLY {
            assert!(!flags.contains(&flag.to_owned()), "{command} lists {flag}");
        }
        let output = run(&[command, "--listen", "127.0.0.1:1"]);
        assert!(!output.status.success(), "{command} accepts --listen");
        assert!(
            stderr(&output).contains("unexpected argument '--listen'"),
            "{}",
            stderr(&output)
        );
    }
}

#[test]
fn scoring_help_lists_every_policy() {
    for command in ["serve", "check-config", "inspect", "explain"] {
        let help = stdout(&run(&[command, "--help"]));
        let scoring = help
            .split("--scoring <POLICY>")
            .nth(1)
            .and_then(|rest| rest.split("\n      --").next())
            .unwrap_or_else(|| panic!("{command} --help has no --scoring:\n{help}"));
        for policy in ScoringPolicy::ALL {
            assert!(
                scoring.contains(policy.as_str()),
                "{command} --scoring help misses {}: {scoring}",
                policy.as_str()
            );
        }
    }
}

#[test]
fn check_config_names_the_policy_it_was_given() {
    for policy in ScoringPolicy::ALL.into_iter().filter(|p| p.uses_typical()) {
        let output = run(&["check-config", "--scoring", policy.as_str()]);
        assert_eq!(output.status.code(), Some(2));
        let err = stderr(&output);
        assert!(
            err.contains(&format!("scoring {} needs typical pods", policy.as_str())),
            "{err}"
        );
    }
    let output = run(&[
        "check-config",
        "--scoring",
        "fgd-plus",
        "--set",
        "policy.typicalPods.learn=true",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stdout(&output).contains("scoring: fgd-plus"),
        "{}",
        stdout(&output)
    );
}

#[test]
fn errors_from_shortcut_flags_name_the_flag_typed() {
    let output = run(&["serve", "--listen", "nowhere"]);
    assert!(!output.status.success());
    let err = stderr(&output);
    assert!(err.contains("server.listen (from flag --listen)"), "{err}");
    assert!(!err.contains("--set"), "{err}");
    let output = run(&["serve", "--set", "server.listen=nowhere"]);
    let err = stderr(&output);
    assert!(err.contains("(from flag --set server.listen)"), "{err}");
    let output = run(&["check-config", "--scoring", "binpak"]);
    let err = stderr(&output);
    assert!(err.contains("'--scoring <POLICY>'"), "{err}");
    assert!(err.contains("binpack, spread, fgd, fgd-plus"), "{err}");
}

#[test]
fn the_from_example_uses_the_default_admin_port() {
    let help = stdout(&run(&["inspect", "--help"]));
    let port = Config::default().server.admin_listen.port();
    assert!(
        help.contains(&format!("http://127.0.0.1:{port} ")),
        "inspect --help's --from example is not on the default admin port {port}:\n{help}"
    );
}

#[test]
fn a_missing_kubeconfig_is_one_clear_line() {
    let missing = "/nonexistent/gpu-extender-test/kubeconfig";
    let by_flag = run(&["inspect", "--kubeconfig", missing]);
    let by_env = command(&scratch("kubeconfig"), &["explain", "p"])
        .env("KUBECONFIG", missing)
        .output()
        .unwrap();
    for output in [by_flag, by_env] {
        assert_eq!(output.status.code(), Some(1));
        let err = stderr(&output);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
        assert!(
            err.contains(&format!("cannot read kubeconfig {missing} (")),
            "{err}"
        );
        assert!(!err.contains("'\""), "{err}");
    }
}

#[test]
fn serve_refuses_an_estimator_off_loopback_without_client_certificates() {
    let dir = scratch("estimator-off-loopback");
    // Never read: the configuration is refused before the API server is looked for.
    let kubeconfig = dir.join("kubeconfig");
    let serve = |extra: &[(&str, &str)]| {
        command(
            &dir,
            &["serve", "--kubeconfig", kubeconfig.to_str().unwrap()],
        )
        .env("GPU_EXTENDER_ESTIMATOR_LISTEN", "0.0.0.0:10352")
        .envs(extra.iter().copied())
        .output()
        .unwrap()
    };
    let refused = serve(&[]);
    assert!(!refused.status.success());
    let err = stderr(&refused);
    for key in [
        "estimator.listen: 0.0.0.0:10352 is not a loopback address",
        "estimator.tls.clientCaFile",
        "estimator.allowUnauthenticated",
    ] {
        assert!(err.contains(key), "{key} is not named:\n{err}");
    }
    assert!(!err.contains("kubeconfig"), "{err}");
    // A server certificate alone is not enough: clients must present theirs.
    let server_only = serve(&[
        ("GPU_EXTENDER_ESTIMATOR_TLS_CERT_FILE", "/tls/tls.crt"),
        ("GPU_EXTENDER_ESTIMATOR_TLS_KEY_FILE", "/tls/tls.key"),
    ]);
    assert!(
        stderr(&server_only).contains("estimator.tls.clientCaFile"),
        "{}",
        stderr(&server_only)
    );
    // With the explicit opt-out the configuration passes, and the start goes on to the
    // kubeconfig (missing here).
    let opted_out = serve(&[("GPU_EXTENDER_ESTIMATOR_ALLOW_UNAUTHENTICATED", "true")]);
    assert!(!opted_out.status.success());
    let err = stderr(&opted_out);
    assert!(!err.contains("estimator.listen"), "{err}");
    assert!(err.contains("kubeconfig"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A stand-in API server on loopback: the node list, the pod list (both empty) and one pod
/// asking for a whole GPU, as JSON; its kubeconfig is written into `dir`.
fn fake_api_server(dir: &Path) -> PathBuf {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            if reader.read_line(&mut request_line).is_err() {
                continue;
            }
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                line.clear();
            }
            let path = request_line.split(' ').nth(1).unwrap_or_default();
            let body = if path.starts_with("/api/v1/nodes") {
                r#"{"kind":"NodeList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}"#
            } else if path.starts_with("/api/v1/pods") {
                r#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}"#
            } else if path.starts_with("/api/v1/namespaces/default/pods/p") {
                r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"default","uid":"u1"},
                   "spec":{"containers":[{"name":"c","image":"i",
                   "resources":{"limits":{"nvidia.com/gpu":"1"}}}]},"status":{"phase":"Pending"}}"#
            } else {
                r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#
            };
            let status = if body.contains("\"code\":404") {
                "404 Not Found"
            } else {
                "200 OK"
            };
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: \
             http://127.0.0.1:{port}\nusers:\n- name: u\n  user: {{}}\ncontexts:\n- name: c\n  \
             context:\n    cluster: fake\n    user: u\ncurrent-context: c\n"
        ),
    )
    .unwrap();
    kubeconfig
}

#[test]
fn inspect_and_explain_print_no_info_lines_and_no_colour() {
    let dir = scratch("logs");
    let kubeconfig = fake_api_server(&dir);
    let kubeconfig = kubeconfig.to_str().unwrap();
    for args in [
        ["inspect", "--kubeconfig", kubeconfig].as_slice(),
        ["explain", "--kubeconfig", kubeconfig, "p"].as_slice(),
    ] {
        let output = command(&dir, args).output().unwrap();
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
        assert_eq!(
            stderr(&output),
            "",
            "{args:?}: stderr must be empty by default"
        );
        assert!(!stdout(&output).contains("INFO"), "{}", stdout(&output));
        assert!(!stdout(&output).contains('\u{1b}'), "{}", stdout(&output));
        // Asked for, the same run does log (so the empty stderr above means something), on
        // stderr only, and without colour codes: stderr is not a terminal here.
        let output = command(&dir, args)
            .env("GPU_EXTENDER_LOG", "info")
            .output()
            .unwrap();
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
        let err = stderr(&output);
        assert!(err.contains("INFO"), "{args:?}: {err}");
        assert!(!err.contains('\u{1b}'), "{args:?}: colour codes in {err:?}");
        assert!(!stdout(&output).contains("INFO"), "{}", stdout(&output));
    }
    let _ = std::fs::remove_dir_all(dir);
}
