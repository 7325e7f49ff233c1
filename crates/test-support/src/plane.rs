//! The one driver of a loopback control plane, shared by the service's end-to-end harness and
//! `gpu-lab replay`: etcd and kube-apiserver (and on request kube-scheduler, kwok, an
//! autoscaler) through the checkout's `scripts/control-plane.sh`, in a directory of their own,
//! and the gpu-extender binary started as a user starts it. Everything started is stopped when
//! the [`ControlPlane`] is dropped, also on error or panic, and its directory removed unless it
//! is to be kept or a panic is unwinding (then it is kept and named); the script's own watchdog stops the plane if this process dies without unwinding.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig};

use crate::http::http_get;

/// A control plane started by `scripts/control-plane.sh`; stopped when dropped.
#[derive(Debug)]
pub struct ControlPlane {
    dir: PathBuf,
    script: PathBuf,
    bins: PathBuf,
    keep: bool,
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver in `dir` (made afresh) with `repo`'s
    /// `scripts/control-plane.sh` and the Kubernetes binaries in `bins`; `env` goes to the
    /// script's `start` (e.g. `CP_FRONT_PROXY=1`). With `keep`, the directory outlives the plane.
    pub fn start(
        repo: &Path,
        bins: &Path,
        dir: PathBuf,
        env: &[(&str, &str)],
        keep: bool,
    ) -> Result<Self> {
        let script = repo.join("scripts/control-plane.sh");
        ensure!(script.is_file(), "{} is missing", script.display());
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .with_context(|| format!("removing stale {}", dir.display()))?;
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let plane = Self {
            dir,
            script,
            bins: bins.to_owned(),
            keep,
        };
        // From here on, dropping `plane` stops whatever the script started.
        plane.run(&["start"], env)?;
        Ok(plane)
    }

    /// The plane's directory: data, pid files, every log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory of the Kubernetes binaries it runs.
    pub fn bins(&self) -> &Path {
        &self.bins
    }

    /// The admin (system:masters) kubeconfig.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// A kubeconfig of this plane's server that authenticates with `token` alone (a
    /// ServiceAccount's, from `kubectl create token`), written to `file` in the plane's directory.
    pub fn kubeconfig_with_token(&self, file: &str, token: &str) -> Result<PathBuf> {
        let mut config = Kubeconfig::read_from(self.kubeconfig())?;
        for user in &mut config.auth_infos {
            user.auth_info = Some(AuthInfo {
                token: Some(token.trim().to_owned().into()),
                ..AuthInfo::default()
            });
        }
        let path = self.dir.join(file);
        // JSON is YAML: kubectl and kube's client read it as a kubeconfig.
        std::fs::write(&path, serde_json::to_string(&config)?)
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// A client with the admin identity.
    pub async fn client(&self) -> Result<kube::Client> {
        client_from(&self.kubeconfig()).await
    }

    /// The address kube-apiserver listens on.
    pub fn apiserver_addr(&self) -> Result<SocketAddr> {
        let path = self.dir.join("kube-apiserver.port");
        let port: u16 = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?
            .trim()
            .parse()
            .with_context(|| format!("parsing {}", path.display()))?;
        Ok(SocketAddr::from(([127, 0, 0, 1], port)))
    }

    /// `scripts/control-plane.sh <args[0]> <dir> <args[1..]>` with `env`, not yet run: for a
    /// caller that runs it off its async runtime and then hands the output to [`Self::check`].
    pub fn command(&self, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut command = Command::new(&self.script);
        if let Some((verb, rest)) = args.split_first() {
            command.arg(verb).arg(&self.dir).args(rest);
        }
        command
            .envs(env.iter().copied())
            .env("K8S_BIN_DIR", &self.bins)
            .env("CP_OWNER_PID", std::process::id().to_string())
            .stdin(Stdio::null());
        command
    }

    /// Fails with the script's output when `output` (of [`Self::command`] with `args`) failed.
    pub fn check(&self, args: &[&str], output: &Output) -> Result<()> {
        if !output.status.success() {
            bail!(
                "control-plane.sh {} failed ({}; logs in {}):\n{}{}",
                args.join(" "),
                output.status,
                self.dir.display(),
                String::from_utf8_lossy(&output.stdout),
                tail(&String::from_utf8_lossy(&output.stderr), 40)
            );
        }
        Ok(())
    }

    /// Runs the script with `args` and `env` and waits for it.
    pub fn run(&self, args: &[&str], env: &[(&str, &str)]) -> Result<()> {
        let output = self
            .command(args, env)
            .output()
            .with_context(|| format!("running {}", self.script.display()))?;
        self.check(args, &output)
    }

    /// [`Self::run`] on a blocking thread, for callers on an async runtime.
    pub async fn run_async(&self, args: &[&str], env: &[(&str, &str)]) -> Result<()> {
        let mut command = self.command(args, env);
        let output = tokio::task::spawn_blocking(move || command.output())
            .await
            .context("control-plane.sh task")?
            .with_context(|| format!("running {}", self.script.display()))?;
        self.check(args, &output)
    }

    /// (Re)starts kube-scheduler with the configuration file `config` (its kubeconfig may be
    /// the placeholder `__KUBECONFIG__`, which the script replaces with the scheduler's own) and
    /// extra command-line `flags`.
    pub async fn start_scheduler(&self, config: &Path, flags: &[&str]) -> Result<()> {
        let config = config.to_string_lossy();
        self.run_async(
            &["scheduler", &config],
            &[("CP_SCHEDULER_EXTRA_ARGS", &flags.join(" "))],
        )
        .await
    }

    /// Stops kube-scheduler.
    pub async fn stop_scheduler(&self) -> Result<()> {
        self.run_async(&["scheduler-stop"], &[]).await
    }

    /// Process ids of the components the script started that are running a pid file, by name.
    pub fn pids(&self) -> Vec<(&'static str, u32)> {
        ["etcd", "kube-apiserver", "kube-scheduler"]
            .into_iter()
            .filter_map(|component| {
                let path = self.dir.join(format!("{component}.pid"));
                let pid = std::fs::read_to_string(&path).ok()?.trim().parse().ok()?;
                Some((component, pid))
            })
            .collect()
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let stop = self
            .command(&["stop"], &[])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output();
        match stop {
            Ok(output) if output.status.success() => {}
            Ok(output) => eprintln!(
                "control-plane.sh stop {} failed: {}",
                self.dir.display(),
                String::from_utf8_lossy(&output.stderr)
            ),
            Err(error) => eprintln!("cannot run control-plane.sh stop: {error}"),
        }
        // A panicking test's plane is kept for inspection, and named.
        if self.keep || std::thread::panicking() {
            eprintln!("kept {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// One `gpu-extender serve` process as [`launch_extender`] starts it.
#[derive(Debug)]
pub struct ExtenderLaunch<'a> {
    /// The gpu-extender binary.
    pub binary: &'a Path,
    /// Log file, appended to (stdout and stderr).
    pub log: &'a Path,
    /// The YAML configuration file.
    pub config: &'a Path,
    pub kubeconfig: &'a Path,
    /// The extender listener (kube-scheduler's urlPrefix).
    pub listen: SocketAddr,
    /// The admin listener (/readyz, /metrics, /inspect).
    pub admin: SocketAddr,
    /// More arguments after `serve` (e.g. `--set KEY=VALUE` pairs).
    pub args: &'a [String],
    /// Environment variables, set after every `GPU_EXTENDER_*` one of this process is removed
    /// (the binary reads those as configuration: the caller's own must not change what runs).
    pub env: &'a [(&'a str, &'a str)],
    /// Which start this is (written to the log).
    pub start: u32,
    /// How long it may take to report ready.
    pub ready_within: Duration,
}

/// Starts `gpu-extender serve` as `launch` says and waits until `/readyz` answers 200, that is
/// until its table holds every node and pod the API server had; a process that exits or never
/// gets ready is an error with its log's tail. `/metrics` is rendered at every scrape
/// (`GPU_EXTENDER_LIMITS_METRICS_RENDER_INTERVAL_MS=0`, unless `launch.env` says otherwise):
/// tests read the counters right after what they count.
pub async fn launch_extender(launch: &ExtenderLaunch<'_>) -> Result<Child> {
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(launch.log)
        .with_context(|| format!("opening {}", launch.log.display()))?;
    writeln!(log, "===== extender start #{}", launch.start)?;
    let mut command = Command::new(launch.binary);
    command
        .arg("serve")
        .arg("--config")
        .arg(launch.config)
        .arg("--kubeconfig")
        .arg(launch.kubeconfig)
        .arg("--listen")
        .arg(launch.listen.to_string())
        .arg("--admin-listen")
        .arg(launch.admin.to_string())
        .args(launch.args);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("GPU_EXTENDER_") {
            command.env_remove(key);
        }
    }
    command
        .env("GPU_EXTENDER_LIMITS_METRICS_RENDER_INTERVAL_MS", "0")
        .envs(launch.env.iter().copied())
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let mut child = command
        .spawn()
        .with_context(|| format!("starting {}", launch.binary.display()))?;
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            bail!(
                "the extender exited during start-up ({status}); its log:\n{}",
                tail_file(launch.log, 30)
            );
        }
        if let Ok((200, _)) = http_get(launch.admin, "/readyz").await {
            return Ok(child);
        }
        if started.elapsed() > launch.ready_within {
            child.kill().ok();
            child.wait().ok();
            bail!(
                "the extender was not ready within {} s; its log:\n{}",
                launch.ready_within.as_secs(),
                tail_file(launch.log, 30)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A client for the cluster `kubeconfig` names.
pub async fn client_from(kubeconfig: &Path) -> Result<kube::Client> {
    let file = Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading kubeconfig {}", kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("kubeconfig {}", kubeconfig.display()))?;
    kube::Client::try_from(config).context("building a client")
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The last `lines` lines of a file (or why it cannot be read).
pub fn tail_file(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => tail(&String::from_utf8_lossy(&bytes), lines),
        Err(error) => format!("({}: {error})", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tails_keep_the_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("a", 5), "a");
        assert!(tail_file(Path::new("/nonexistent/log"), 3).contains("/nonexistent/log"));
    }

    #[test]
    fn the_script_is_run_with_the_directory_after_its_verb() {
        let plane = ControlPlane {
            dir: PathBuf::from("/plane"),
            script: PathBuf::from("/repo/scripts/control-plane.sh"),
            bins: PathBuf::from("/bins"),
            keep: true,
        };
        let command = plane.command(&["scheduler", "/plane/s.yaml"], &[("A", "1")]);
        let args: Vec<_> = command.get_args().map(|a| a.to_string_lossy()).collect();
        assert_eq!(args, ["scheduler", "/plane", "/plane/s.yaml"]);
        let envs: Vec<_> = command
            .get_envs()
            .map(|(k, v)| (k.to_string_lossy(), v.map(|v| v.to_string_lossy())))
            .collect();
        assert!(envs.contains(&("K8S_BIN_DIR".into(), Some("/bins".into()))));
        assert!(envs.contains(&("A".into(), Some("1".into()))));
        // Dropping it would run the script's stop: this one was never started.
        std::mem::forget(plane);
    }
}
