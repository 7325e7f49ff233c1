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
use std::sync::atomic::{AtomicUsize, Ordering};

use gpu_extender::config::Config;
use gpu_extender::engine::ScoringPolicy;

const BIN: &str = env!("CARGO_BIN_EXE_gpu-extender");

/// The binary with `args`, in `dir`, with no `GPU_EXTENDER_*`, `RUST_LOG` or `KUBECONFIG` of the
/// caller's (they would change what is printed).
fn command(dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command.args(args).current_dir(dir);
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy().into_owned();
        if name.starts_with("GPU_EXTENDER_") || name == "RUST_LOG" || name == "KUBECONFIG" {
            command.env_remove(name);
        }
    }
    command
}

/// The binary with `args` in a directory of its own (tests run in parallel).
fn run(args: &[&str]) -> Output {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let dir = scratch(&format!("run-{}", RUNS.fetch_add(1, Ordering::Relaxed)));
    let output = command(&dir, args).output().unwrap();
    let _ = std::fs::remove_dir_all(dir);
    output
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// An empty directory of this test's own.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpu-extender-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The flags a command's `--help` lists.
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
fn a_negative_tune_reaches_the_range_check() {
    for command in ["simulate", "replay"] {
        let output = run(&[command, "--tune", "-1"]);
        assert!(!output.status.success());
        let err = stderr(&output);
        assert!(
            err.contains("--tune must be a non-negative number, got -1"),
            "{command}: {err}"
        );
    }
}

#[test]
fn simulate_says_where_it_wrote() {
    let dir = scratch("simulate");
    let output = command(
        &dir,
        &["simulate", "--seeds", "1", "--policies", "fgd", "--quiet"],
    )
    .output()
    .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let out = stdout(&output);
    let written = dir.join("sim-out");
    assert!(
        out.contains(&format!("to {} (created)", written.display())),
        "{out}"
    );
    for file in ["summary.md", "runs.csv", "discrete.csv", "steps.csv"] {
        assert!(out.contains(file), "{out}");
        assert!(written.join(file).is_file(), "{file} not written");
    }
    let again = command(
        &dir,
        &["simulate", "--seeds", "1", "--policies", "fgd", "--quiet"],
    )
    .output()
    .unwrap();
    let again = stdout(&again);
    assert!(
        again.contains(&format!("to {}\n", written.display())),
        "{again}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn cluster_writes_a_node_list_that_simulate_replays() {
    let dir = scratch("cluster");
    std::fs::write(
        dir.join("openb_node_list_gpu_node.csv"),
        "sn,cpu_milli,memory_mib,gpu,model\n\
         n0,96000,393216,8,G2\nn1,104000,524288,2,T4\nn2,104000,524288,2,T4\nn3,16000,122880,2,P100\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("openb_pod_list_tiny.csv"),
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n\
         p0,4000,8192,1,1000,\np1,2000,4096,1,500,\np2,8000,16384,2,1000,\np3,1000,2048,0,0,\n",
    )
    .unwrap();
    let trace_dir = dir.to_str().unwrap();
    // `gpu-extender cluster --trace-dir DIR` with `args` after it.
    let cluster = |args: &[&str]| {
        let mut all = vec!["cluster", "--trace-dir", trace_dir];
        all.extend_from_slice(args);
        command(&dir, &all).output().unwrap()
    };
    let made = cluster(&[
        "--change",
        "without=T4",
        "--change",
        "cpu=0.5",
        "--out",
        "out",
        "--name",
        "small",
    ]);
    assert!(made.status.success(), "{}", stderr(&made));
    let written = dir.join("out/openb_node_list_small.csv");
    let said = stdout(&made);
    assert!(
        said.contains("out/openb_node_list_small.csv: 2 nodes, 10 GPUs, 5.6 cores")
            && said.contains("4 nodes, 14 GPUs"),
        "{said}"
    );
    assert_eq!(
        std::fs::read_to_string(&written).unwrap(),
        "sn,cpu_milli,memory_mib,gpu,model\nn0,48000,393216,8,G2\nn3,8000,122880,2,P100\n"
    );
    let nodes = written.to_str().unwrap();
    let replayed = command(
        &dir,
        &[
            "simulate",
            "--trace-dir",
            trace_dir,
            "--nodes",
            nodes,
            "--trace",
            "tiny",
            "--seeds",
            "1",
            "--policies",
            "fgd,fgd-plus",
            "--quiet",
            "--out",
            "sim",
        ],
    )
    .output()
    .unwrap();
    assert!(replayed.status.success(), "{}", stderr(&replayed));
    let runs = std::fs::read_to_string(dir.join("sim/runs.csv")).unwrap();
    assert_eq!(runs.lines().count(), 3, "{runs}");

    // A model no node has is refused, naming the models there are; nothing is written.
    let refused = cluster(&["--change", "without=A100", "--out", "bad"]);
    assert!(!refused.status.success());
    let err = stderr(&refused);
    assert!(
        err.contains(
            "gpu-extender cluster: without=A100: no node has that model (models: G2, P100, T4)"
        ),
        "{err}"
    );
    assert!(!dir.join("bad").exists());

    // More of one model: each P100 node three times, its copies beside it, under the default
    // name.
    let more = cluster(&["--change", "more=P100:3", "--out", "out"]);
    assert!(more.status.success(), "{}", stderr(&more));
    let written = std::fs::read_to_string(dir.join("out/openb_node_list_P100x3-s42.csv")).unwrap();
    let names: Vec<&str> = written
        .lines()
        .skip(1)
        .filter_map(|line| line.split(',').next())
        .collect();
    assert_eq!(
        names,
        ["n0", "n1", "n2", "n3", "n3-c1", "n3-c2"],
        "{written}"
    );
    assert!(
        stdout(&more).contains("6 nodes, 18 GPUs"),
        "{}",
        stdout(&more)
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn simulate_replays_kube_scheduler_s_window_only_for_a_percentage_it_accepts() {
    let refused = run(&["simulate", "--percentage-of-nodes-to-score", "101"]);
    assert!(!refused.status.success());
    let err = stderr(&refused);
    assert!(err.contains("101 is not in 0..=100"), "{err}");
    // Retrying what the window turned away means nothing without a window.
    let refused = run(&["simulate", "--retry-window-misses"]);
    assert!(!refused.status.success());
    let err = stderr(&refused);
    assert!(err.contains("--percentage-of-nodes-to-score"), "{err}");
    let dir = scratch("simulate-window");
    let output = command(
        &dir,
        &[
            "simulate",
            "--seeds",
            "1",
            "--policies",
            "fgd-plus",
            "--quiet",
            "--percentage-of-nodes-to-score",
            "0",
        ],
    )
    .output()
    .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    // The built-in example's 32 nodes are under kube-scheduler's floor of 100: all are sent.
    let out = stdout(&output);
    assert!(
        out.contains(
            "percentageOfNodesToScore 0, adaptive): each pod chooses among the first 32 nodes"
        ),
        "{out}"
    );
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
