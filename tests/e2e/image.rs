//! The image as it is built and run, without Docker: the service compiled from exactly the build
//! context `.dockerignore` sends (a filtered copy of the checkout, `--locked`), and an OCI image
//! assembled with umoci as the Dockerfile's final stage describes it (its user, entrypoint,
//! command and ports read from the Dockerfile) on an empty base, holding the binary this test
//! target built and the C libraries it links, as distroless' `cc` base provides them. The
//! binary then runs from the image's unpacked root filesystem the way a container runtime with
//! deploy/'s securityContext would run it: as the image's uid and gid, the root mounted
//! read-only with a tmpfs on /tmp (the Deployment's emptyDir), no shell in the image, no HOME,
//! and the configuration and kubeconfig where the Deployment mounts them. It must serve
//! `/healthz`, `/readyz` and `/metrics` (its build identity among them) against a real
//! kube-apiserver, and stop cleanly on SIGTERM.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use gpu_test_support::image::{Dockerfile, copy_context};
use gpu_test_support::metrics::metric_sum;

use crate::harness::{self, EXTENDER_BIN, ROOT, free_port, http_get, tail_file};

/// Environment variable: the umoci binary (`scripts/umoci.sh` installs Debian's package and
/// prints its path; asked for when unset).
const UMOCI_ENV: &str = "GPU_TEST_UMOCI";

/// Where the image's configuration and kubeconfig are mounted (deploy/deployment.yaml).
const CONFIG_DIR: &str = "/etc/gpu-extender";

#[test]
#[ignore = "end-to-end: needs cargo and the registry cache; make test runs it, or cargo test --test e2e -- --ignored"]
fn the_service_compiles_from_exactly_the_image_build_context() {
    harness::run_with_bins("image-context", |_bins| {
        let scratch =
            std::env::temp_dir().join(format!("gpu-extender-image-context-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&scratch);
        let files = copy_context(Path::new(ROOT), &scratch)?;
        ensure!(
            !files
                .iter()
                .any(|f| f.starts_with("tests") || f.starts_with("docs")),
            "the build context carries tests or docs: {files:?}"
        );
        // What the image's builder runs, in the copy. `cargo check`: every file, the lock file,
        // the build script and its proto/ input, the features and the manifests are what can
        // drift from the Dockerfile, and checking them needs no code generation, which would
        // add a release build of every dependency to each CI run (docs/install.md). Its own
        // target directory beside the run's (`<CARGO_TARGET_DIR>-image-context`, CI's apart
        // from a developer's: scripts/ci-mtimes.sh), so that it cannot touch the binaries the
        // other scenarios run.
        let target_dir = match std::env::var_os("CARGO_TARGET_DIR") {
            Some(dir) => {
                let mut dir = dir;
                dir.push("-image-context");
                PathBuf::from(dir)
            }
            None => std::env::var_os("GPU_TEST_CACHE")
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/gpu-extender"))
                })
                .ok_or_else(|| anyhow!("neither CARGO_TARGET_DIR, GPU_TEST_CACHE nor HOME is set"))?
                .join("target-image-context"),
        };
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let started = Instant::now();
        let output = Command::new(cargo)
            .current_dir(&scratch)
            .args([
                "check",
                "--release",
                "--locked",
                "-p",
                "gpu-extender",
                "--bin",
                "gpu-extender",
            ])
            .arg("--target-dir")
            .arg(&target_dir)
            .env_remove("CARGO_TARGET_DIR")
            .env("SOURCE_COMMIT", "0123456789ab")
            .env("CARGO_TERM_COLOR", "never")
            .stdin(Stdio::null())
            .output()
            .context("running cargo in the build context")?;
        let _ = std::fs::remove_dir_all(&scratch);
        ensure!(
            output.status.success(),
            "the service does not compile from the image's build context ({}):\n{}",
            output.status,
            harness::tail(&String::from_utf8_lossy(&output.stderr), 40)
        );
        eprintln!(
            "e2e image-context: {} files, compiled in {:.1}s",
            files.len(),
            started.elapsed().as_secs_f64()
        );
        Ok(())
    });
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries and umoci; make test runs it, or cargo test --test e2e -- --ignored"]
fn the_image_runs_as_shipped_read_only_unprivileged_without_a_shell() {
    harness::run("image", async |c| {
        let umoci = umoci()?;
        let dockerfile = Dockerfile::parse(
            &std::fs::read_to_string(Path::new(ROOT).join("Dockerfile")).context("Dockerfile")?,
        );
        let image = c.dir.join("oci");
        let layout = format!("{}:gpu-extender", image.display());
        let run = |args: &[&str]| -> Result<()> {
            let output = Command::new(&umoci)
                .args(args)
                .stdin(Stdio::null())
                .output()
                .with_context(|| format!("running umoci {}", args.join(" ")))?;
            ensure!(
                output.status.success(),
                "umoci {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr)
            );
            Ok(())
        };

        // An empty base, the binary and what distroless' cc base gives it (the C libraries,
        // /etc/passwd and /etc/group), then the final stage's config.
        let build = c.dir.join("image-build");
        let build_s = build.to_string_lossy().into_owned();
        run(&["init", "--layout", &image.to_string_lossy()])?;
        run(&["new", "--image", &layout])?;
        run(&["unpack", "--image", &layout, &build_s])?;
        let entrypoint = dockerfile.exec_form("ENTRYPOINT")?;
        let command = dockerfile.exec_form("CMD")?;
        let user = dockerfile
            .last_final("USER")
            .ok_or_else(|| anyhow!("the Dockerfile's final stage has no USER"))?
            .to_owned();
        populate(&build.join("rootfs"), &entrypoint[0], &user)?;
        run(&["repack", "--image", &layout, &build_s])?;
        let mut config = vec![
            "config".to_owned(),
            "--image".to_owned(),
            layout.clone(),
            format!("--config.user={user}"),
            format!("--config.entrypoint={}", entrypoint.join(" ")),
            format!("--config.cmd={}", command.join(" ")),
        ];
        for port in dockerfile.exposed_ports() {
            config.push(format!("--config.exposedports={port}/tcp"));
        }
        run(&config.iter().map(String::as_str).collect::<Vec<_>>())?;

        // The image as a runtime gets it.
        let bundle = c.dir.join("image-run");
        run(&["unpack", "--image", &layout, &bundle.to_string_lossy()])?;
        let spec: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(bundle.join("config.json")).context("the runtime config")?,
        )?;
        let rootfs = bundle.join(spec["root"]["path"].as_str().unwrap_or("rootfs"));
        let process = &spec["process"];
        let uid = process["user"]["uid"].as_u64().unwrap_or(0);
        let gid = process["user"]["gid"].as_u64().unwrap_or(0);
        ensure!(
            format!("{uid}:{gid}") == user && uid != 0,
            "the image runs as {uid}:{gid}, the Dockerfile says {user}"
        );
        let args: Vec<String> = process["args"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str().map(str::to_owned))
            .collect();
        ensure!(
            args == [entrypoint.clone(), command.clone()].concat(),
            "the image runs {args:?}"
        );
        for shell in ["bin/sh", "bin/bash", "usr/bin/sh", "bin/busybox"] {
            ensure!(
                !rootfs.join(shell).exists(),
                "the image has a shell: /{shell}"
            );
        }
        // The runtime's environment, less HOME: nothing in the image may need one.
        let env: Vec<String> = process["env"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e.as_str().map(str::to_owned))
            .filter(|e| !e.starts_with("HOME="))
            .collect();

        // What the Deployment mounts: the configuration and a kubeconfig (the in-cluster
        // service account's stand-in) under /etc/gpu-extender, written before the root is made
        // read-only.
        let mounted = rootfs.join(CONFIG_DIR.trim_start_matches('/'));
        std::fs::create_dir_all(&mounted)?;
        std::fs::write(
            mounted.join("config.yaml"),
            "server:\n  adminAuth: {paths: []}\n",
        )?;
        std::fs::copy(c.kubeconfig(), mounted.join("kubeconfig"))?;
        // Mounted volumes' default mode (a ConfigMap's, a projected token's with the pod's
        // fsGroup): readable by the image's user, writable by nobody in the pod.
        for file in ["config.yaml", "kubeconfig"] {
            std::fs::set_permissions(
                mounted.join(file),
                std::os::unix::fs::PermissionsExt::from_mode(0o644),
            )?;
        }
        let (listen, admin) = (free_port()?, free_port()?);
        let serve_args = [
            format!("--config={CONFIG_DIR}/config.yaml"),
            format!("--kubeconfig={CONFIG_DIR}/kubeconfig"),
            format!("--listen=127.0.0.1:{listen}"),
            format!("--admin-listen=127.0.0.1:{admin}"),
        ];

        // --version, as `docker run IMAGE --version` would run it.
        let version = contained(
            &rootfs,
            uid,
            gid,
            &env,
            &entrypoint,
            &["--version".to_owned()],
        )
        .output()
        .context("running the image's --version")?;
        let printed = String::from_utf8_lossy(&version.stdout);
        ensure!(
            version.status.success()
                && printed.contains(gpu_extender::build_info::VERSION)
                && printed.contains(gpu_extender::build_info::COMMIT),
            "--version in the image printed {printed:?} ({})",
            version.status
        );

        let log_path = c.dir.join("image-extender.log");
        let log = std::fs::File::create(&log_path)?;
        let mut child = contained(
            &rootfs,
            uid,
            gid,
            &env,
            &entrypoint,
            &[command.clone(), serve_args.to_vec()].concat(),
        )
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting the image's process")?;
        let outcome = async {
            let admin_addr = std::net::SocketAddr::from(([127, 0, 0, 1], admin));
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                if let Some(status) = child.try_wait()? {
                    bail!(
                        "the image's process exited ({status}): {}",
                        tail_file(&log_path, 30)
                    );
                }
                if matches!(http_get(admin_addr, "/readyz").await, Ok((200, _))) {
                    break;
                }
                ensure!(
                    Instant::now() < deadline,
                    "not ready within 60 s: {}",
                    tail_file(&log_path, 30)
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let (status, _) = http_get(admin_addr, "/healthz").await?;
            ensure!(status == 200, "/healthz answered {status}");
            let (status, metrics) = http_get(admin_addr, "/metrics").await?;
            ensure!(status == 200, "/metrics answered {status}");
            let build = metric_sum(
                &metrics,
                "gpu_extender_build_info",
                &[
                    ("version", gpu_extender::build_info::VERSION),
                    ("commit", gpu_extender::build_info::COMMIT),
                ],
            );
            ensure!(
                build == 1.0,
                "gpu_extender_build_info for this build is {build}"
            );

            // The process itself: the image's uid and gid, no HOME, a read-only root.
            let pid = child.id();
            let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
            let ids = |key: &str| -> Option<Vec<u64>> {
                let line = status.lines().find(|l| l.starts_with(key))?;
                Some(
                    line.split_whitespace()
                        .skip(1)
                        .filter_map(|v| v.parse().ok())
                        .collect(),
                )
            };
            ensure!(
                ids("Uid:").is_some_and(|v| v.iter().all(|&id| id == uid))
                    && ids("Gid:").is_some_and(|v| v.iter().all(|&id| id == gid)),
                "the process runs as {:?} / {:?}",
                ids("Uid:"),
                ids("Gid:")
            );
            let environ = std::fs::read(format!("/proc/{pid}/environ"))?;
            ensure!(
                !environ.split(|&b| b == 0).any(|v| v.starts_with(b"HOME=")),
                "the process has a HOME"
            );
            let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))?;
            let root = mounts
                .lines()
                .find(|line| line.split_whitespace().nth(4) == Some("/"))
                .ok_or_else(|| anyhow!("no root mount in the process's mountinfo"))?;
            ensure!(
                root.split_whitespace()
                    .nth(5)
                    .is_some_and(|options| options.split(',').any(|o| o == "ro")),
                "the process's root is not read-only: {root}"
            );
            // SIGTERM, as the kubelet stops it: a clean exit.
            let stopped = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()?;
            ensure!(stopped.success(), "kill -TERM {pid} failed");
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                if let Some(status) = child.try_wait()? {
                    ensure!(status.success(), "it exited with {status} on SIGTERM");
                    return Ok(());
                }
                ensure!(
                    Instant::now() < deadline,
                    "still running 15 s after SIGTERM"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        .await;
        let _ = child.kill();
        let _ = child.wait();
        outcome
    });
}

/// The image's process, contained as a runtime would: a mount namespace of its own where the
/// image's root is bind-mounted read-only, with a tmpfs on /tmp and /proc; then, with exactly
/// `env`, chrooted into it as `uid:gid`, running `entrypoint` with `args`. Every step execs
/// the next, so the child's pid is the image process's.
fn contained(
    rootfs: &Path,
    uid: u64,
    gid: u64,
    env: &[String],
    entrypoint: &[String],
    args: &[String],
) -> Command {
    let mut command = Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c"])
        .arg(
            "set -e; R=$1; shift; mount --bind \"$R\" \"$R\"; mount -o remount,bind,ro \"$R\"; \
             mount -t tmpfs -o mode=1777 tmpfs \"$R/tmp\"; mount -t proc proc \"$R/proc\"; \
             exec \"$@\"",
        )
        .arg("contain")
        .arg(rootfs)
        .arg("/usr/bin/env")
        .arg("-i")
        .args(env)
        .arg("/usr/sbin/chroot")
        .arg(format!("--userspec={uid}:{gid}"))
        .arg("--groups=")
        .arg(rootfs)
        .args(entrypoint)
        .args(args)
        .stdin(Stdio::null());
    command
}

/// The image's files: the binary this test target built at `entrypoint`, the shared libraries
/// it links (as `ldd` finds them on this Debian 12, the distroless base's release), the
/// `/etc/passwd` and `/etc/group` entries of the image's user, and the mount points (/tmp,
/// /proc) a runtime fills. No shell, no package manager, no home directory.
fn populate(rootfs: &Path, entrypoint: &str, user: &str) -> Result<()> {
    let binary = rootfs.join(entrypoint.trim_start_matches('/'));
    std::fs::create_dir_all(binary.parent().ok_or_else(|| anyhow!("bad entrypoint"))?)?;
    std::fs::copy(EXTENDER_BIN, &binary).context("copying the binary into the image")?;
    let ldd = Command::new("ldd")
        .arg(EXTENDER_BIN)
        .output()
        .context("running ldd")?;
    ensure!(ldd.status.success(), "ldd {EXTENDER_BIN} failed");
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
        let path = line
            .split("=>")
            .last()
            .and_then(|rest| rest.split_whitespace().next())
            .filter(|path| path.starts_with('/'));
        if let Some(path) = path {
            let target = rootfs.join(path.trim_start_matches('/'));
            std::fs::create_dir_all(
                target
                    .parent()
                    .ok_or_else(|| anyhow!("bad library {path}"))?,
            )?;
            // Copied, not linked: the image holds the file itself.
            std::fs::copy(path, &target).with_context(|| format!("copying {path}"))?;
        }
    }
    let (uid, gid) = user
        .split_once(':')
        .ok_or_else(|| anyhow!("USER {user} is not uid:gid"))?;
    std::fs::create_dir_all(rootfs.join("etc"))?;
    std::fs::write(
        rootfs.join("etc/passwd"),
        format!(
            "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{uid}:{gid}:nonroot:/home/nonroot:/sbin/nologin\n"
        ),
    )?;
    std::fs::write(
        rootfs.join("etc/group"),
        format!("root:x:0:\nnonroot:x:{gid}:\n"),
    )?;
    for dir in ["tmp", "proc"] {
        std::fs::create_dir_all(rootfs.join(dir))?;
    }
    Ok(())
}

/// The umoci binary: `$GPU_TEST_UMOCI`, else what `scripts/umoci.sh` prints (it installs
/// Debian's package when missing).
fn umoci() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(UMOCI_ENV) {
        return Ok(PathBuf::from(path));
    }
    let output = Command::new(Path::new(ROOT).join("scripts/umoci.sh"))
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .context("running scripts/umoci.sh")?;
    ensure!(
        output.status.success(),
        "scripts/umoci.sh failed ({}): the image scenario needs umoci; set {UMOCI_ENV}",
        output.status
    );
    let path = String::from_utf8_lossy(&output.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_owned();
    Ok(PathBuf::from(path))
}
