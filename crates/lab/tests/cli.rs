//! `gpu-lab` as a user meets it: the built binary run with bad and good arguments, its messages
//! and what it leaves on disk.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed setup step should stop the test with its message"
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gpu_test_support::cli::{self, stderr, stdout};

const BIN: &str = env!("CARGO_BIN_EXE_gpu-lab");

fn command(dir: &Path, args: &[&str]) -> Command {
    cli::command(BIN, dir, args)
}

fn run(args: &[&str]) -> Output {
    cli::run(BIN, args).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    cli::scratch(name).unwrap()
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
    // `gpu-lab cluster --trace-dir DIR` with `args` after it.
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
            "gpu-lab cluster: without=A100: no node has that model (models: G2, P100, T4)"
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
