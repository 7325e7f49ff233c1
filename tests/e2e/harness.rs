//! The processes of one scenario: a loopback control plane (etcd + kube-apiserver, through
//! the workspace's one driver, `gpu_test_support::plane`), the gpu-extender binary and
//! kube-scheduler, all in one temporary directory, all stopped when the [`Cluster`] is dropped
//! (also when a scenario panics; and the control plane's own watchdog stops it if this process
//! dies without unwinding).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};

pub use gpu_test_support::http::{http_get, http_get_bearer, http_post_json};
pub use gpu_test_support::metrics::metric_sum;
use gpu_test_support::plane::{ControlPlane, ExtenderLaunch as Launch};
pub use gpu_test_support::plane::{tail, tail_file};
pub use gpu_test_support::port::free_port;

/// The repository root.
pub const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// The extender binary cargo built for this test target.
pub const EXTENDER_BIN: &str = env!("CARGO_BIN_EXE_gpu-extender");
/// The extender URL the shipped scheduler configurations carry; the harness rewrites it to the
/// test extender's address.
pub const SHIPPED_EXTENDER_URL: &str = "http://127.0.0.1:8888/scheduler";
/// The kubeconfig path the shipped scheduler configurations carry; the harness rewrites it to
/// `__KUBECONFIG__`, which `control-plane.sh scheduler` replaces with the plane's scheduler
/// kubeconfig.
pub const SHIPPED_KUBECONFIG: &str = "/etc/kubernetes/scheduler.conf";
/// Where deploy/ runs the extender, and as whom ([`Cluster::run_extender_as_deployed`]).
const DEPLOYED_NAMESPACE: &str = "gpu-extender";
const DEPLOYED_ACCOUNT: &str = "gpu-scheduler";
/// The user the extender is when it runs as deploy/ runs it.
pub const DEPLOYED_USER: &str = "system:serviceaccount:gpu-extender:gpu-scheduler";
/// The scheduler configuration most scenarios run: the `gpu-scheduler` profile.
pub const PROFILE_CONFIG: &str = "scheduler-config/gpu-scheduler-profile.yaml";
/// The profile GPU pods select in most scenarios.
pub const GPU_SCHEDULER: &str = "gpu-scheduler";

/// Environment variable: directory with etcd, kube-apiserver, kube-scheduler, kubectl (and
/// kube-controller-manager, for the scenarios that start it).
pub const BIN_ENV: &str = "GPU_TEST_K8S_BIN";
/// Environment variable: directory with kwok and cluster-autoscaler (`scripts/autoscaler-bins.sh`
/// builds them; asked for when unset).
pub const AUTOSCALER_BIN_ENV: &str = "GPU_TEST_AUTOSCALER_BIN";
/// Environment variable: cluster-autoscaler's source (default
/// `../shared/third_party/cluster-autoscaler` beside the checkout), which no registry serves.
pub const AUTOSCALER_SRC_ENV: &str = "GPU_TEST_AUTOSCALER_SRC";
/// Environment variable: `1` keeps each scenario's directory (logs, configs) after it ends.
pub const KEEP_ENV: &str = "GPU_TEST_E2E_KEEP";

/// The longest any one scenario may run before it is failed.
const SCENARIO_LIMIT: Duration = Duration::from_secs(300);

/// Scenarios run one at a time: each has its own control plane, and two at once on a 2-core
/// machine would make the timing checks meaningless.
static SERIAL: Mutex<()> = Mutex::new(());

/// Runs one scenario (every scenario is `#[ignore]`d, so it runs only when asked for with
/// `--ignored`): fails when the Kubernetes binaries are unavailable; otherwise starts a control plane, hands it to `scenario`, and tears
/// everything down whatever happens. An error fails the test with the log tails printed.
pub fn run<F>(name: &str, scenario: F)
where
    F: for<'a> AsyncFnOnce(&'a mut Cluster) -> Result<()>,
{
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let bins = k8s_bins_or_fail(name);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => panic!("{name}: cannot build a tokio runtime: {error}"),
    };
    let started = Instant::now();
    let outcome: Result<()> = runtime.block_on(async {
        let mut cluster = Cluster::start(name, &bins, &[]).await?;
        let result = match tokio::time::timeout(SCENARIO_LIMIT, scenario(&mut cluster)).await {
            Ok(result) => result,
            Err(_) => Err(anyhow!(
                "scenario did not finish within {}s",
                SCENARIO_LIMIT.as_secs()
            )),
        };
        let result = result.and_then(|()| cluster.check_extender_log());
        if result.is_err() {
            cluster.failed = true;
        }
        drop(cluster);
        result
    });
    drop(runtime);
    match outcome {
        Ok(()) => eprintln!(
            "e2e {name}: passed in {:.1}s",
            started.elapsed().as_secs_f64()
        ),
        Err(error) => panic!("e2e {name} failed: {error:#}"),
    }
}

/// [`run`] for a scenario with cluster-autoscaler in the loop. cluster-autoscaler is built from
/// its source beside the checkout (`../shared/third_party/cluster-autoscaler`), which no
/// registry serves: where that folder is absent (a newcomer's clone) and no built
/// cluster-autoscaler was given, the scenario says SKIPPED with the reason and passes, whatever
/// `GPU_TEST_E2E` says; where it is present, the scenario is required like any other.
pub fn run_autoscaling<F>(name: &str, scenario: F)
where
    F: for<'a> AsyncFnOnce(&'a mut Cluster) -> Result<()>,
{
    if let Some(why) = autoscaler_missing() {
        eprintln!("e2e {name}: SKIPPED: {why}");
        return;
    }
    run(name, scenario);
}

/// Why cluster-autoscaler cannot be had, when it cannot: neither a built one in
/// `$GPU_TEST_AUTOSCALER_BIN` nor its source to build it from.
fn autoscaler_missing() -> Option<String> {
    let given = std::env::var_os(AUTOSCALER_BIN_ENV)
        .map(PathBuf::from)
        .is_some_and(|dir| dir.join("cluster-autoscaler").is_file());
    let source = std::env::var_os(AUTOSCALER_SRC_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(ROOT).join("../shared/third_party/cluster-autoscaler"));
    (!given && !source.join("go.mod").is_file()).then(|| {
        format!(
            "no cluster-autoscaler: its source is not at {} (it is not on the Go module proxy; \
             CI has the folder) and {AUTOSCALER_BIN_ENV} names no directory with a built one",
            source.display()
        )
    })
}

/// Runs a check that needs the Kubernetes binaries but starts its own processes (the replay
/// command runs its own control plane): fails without them like [`run`], runs alone like [`run`].
pub fn run_with_bins(name: &str, check: impl FnOnce(&Path) -> Result<()>) {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let bins = k8s_bins_or_fail(name);
    let started = Instant::now();
    match check(&bins) {
        Ok(()) => eprintln!(
            "e2e {name}: passed in {:.1}s",
            started.elapsed().as_secs_f64()
        ),
        Err(error) => panic!("e2e {name} failed: {error:#}"),
    }
}

enum Bins {
    Ready(PathBuf),
    Missing(String),
}

/// The Kubernetes binaries directory, found once per test process.
fn k8s_bins() -> &'static Bins {
    static BINS: OnceLock<Bins> = OnceLock::new();
    BINS.get_or_init(|| {
        find_bins(
            BIN_ENV,
            "scripts/k8s-bins.sh",
            &["etcd", "kube-apiserver", "kube-scheduler", "kubectl"],
        )
    })
}

/// The autoscaling components' directory (kwok, cluster-autoscaler), found once per test process.
fn autoscaler_bins() -> &'static Bins {
    static BINS: OnceLock<Bins> = OnceLock::new();
    BINS.get_or_init(|| {
        find_bins(
            AUTOSCALER_BIN_ENV,
            "scripts/autoscaler-bins.sh",
            &["kwok", "cluster-autoscaler"],
        )
    })
}

/// The directory `env` names, else the one `script` prints last (building the binaries); ready
/// when every one of `names` is in it.
fn find_bins(env: &str, script: &str, names: &[&str]) -> Bins {
    let dir = match std::env::var_os(env) {
        Some(dir) => PathBuf::from(dir),
        None => {
            eprintln!("e2e: {env} is not set; asking {script} (a first build takes minutes)");
            let output = Command::new(Path::new(ROOT).join(script))
                .stdin(Stdio::null())
                .stderr(Stdio::inherit())
                .output();
            match output {
                Ok(output) if output.status.success() => {
                    let stdout = String::from_utf8_lossy(&output.stdout);
                    PathBuf::from(stdout.lines().last().unwrap_or_default().trim())
                }
                Ok(output) => {
                    return Bins::Missing(format!(
                        "{script} failed ({}); see its message above",
                        output.status
                    ));
                }
                Err(error) => return Bins::Missing(format!("cannot run {script}: {error}")),
            }
        }
    };
    let missing: Vec<&str> = names
        .iter()
        .copied()
        .filter(|b| !dir.join(b).is_file())
        .collect();
    if missing.is_empty() {
        Bins::Ready(dir)
    } else {
        Bins::Missing(format!(
            "{} missing in {}",
            missing.join(", "),
            dir.display()
        ))
    }
}

/// The Kubernetes binaries, or a failure saying how to get them: a scenario that was asked to
/// run and cannot is a failure, never a pass.
fn k8s_bins_or_fail(name: &str) -> PathBuf {
    match k8s_bins() {
        Bins::Ready(dir) => dir.clone(),
        Bins::Missing(why) => panic!(
            "e2e {name}: no control plane ({why}). Run `make test`, or set {BIN_ENV} to a \
             directory with etcd, kube-apiserver, kube-scheduler and kubectl (scripts/k8s-bins.sh \
             builds them); without them, leave the end-to-end tests ignored (plain `cargo test`)."
        ),
    }
}

/// A running extender process.
#[derive(Debug)]
struct ExtenderProc {
    child: Child,
}

/// One scenario's cluster: control plane, extender, kube-scheduler, and an admin client.
pub struct Cluster {
    pub name: String,
    /// The scenario's directory: plane data and every log.
    pub dir: PathBuf,
    pub bins: PathBuf,
    plane: ControlPlane,
    /// Admin (system:masters) client.
    pub client: kube::Client,
    /// Extender listener (the scheduler's urlPrefix host and port), fixed for the cluster's life
    /// so kube-scheduler keeps reaching a restarted extender.
    pub extender_addr: SocketAddr,
    /// Extender admin listener: /readyz, /metrics, /inspect.
    pub admin_addr: SocketAddr,
    extender: Option<ExtenderProc>,
    extender_config: String,
    /// The kubeconfig the extender gets, when not the admin one (see
    /// [`Cluster::route_extender_through`]).
    extender_kubeconfig: Option<PathBuf>,
    /// The kubeconfig of the ServiceAccount the extender runs as, when it runs as deploy/ runs it
    /// (see [`Cluster::run_extender_as_deployed`]); for the extender only, never for `kubectl`.
    extender_identity: Option<PathBuf>,
    extender_starts: u32,
    /// Set when the scenario failed: logs are printed on drop.
    pub failed: bool,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("name", &self.name)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// Another control plane beside this scenario's (multi-cluster scenarios), named `name`,
    /// with `env` for `control-plane.sh start` (e.g. `CP_FRONT_PROXY=1`); stopped when dropped,
    /// like this one.
    pub async fn start_beside(&self, name: &str, env: &[(&str, &str)]) -> Result<Self> {
        Self::start(name, &self.bins, env).await
    }

    /// Starts etcd and kube-apiserver in a fresh directory (`env`: for `control-plane.sh
    /// start`) and connects an admin client.
    async fn start(name: &str, bins: &Path, env: &[(&str, &str)]) -> Result<Self> {
        let dir =
            std::env::temp_dir().join(format!("gpu-extender-e2e-{}-{name}", std::process::id()));
        let t0 = Instant::now();
        let keep = std::env::var(KEEP_ENV).as_deref() == Ok("1");
        let owned_env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let (plane_bins, plane_dir) = (bins.to_owned(), dir.clone());
        // From here on, dropping the plane stops whatever was started.
        let plane = tokio::task::spawn_blocking(move || {
            let env: Vec<(&str, &str)> = owned_env
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            ControlPlane::start(Path::new(ROOT), &plane_bins, plane_dir, &env, keep)
        })
        .await
        .context("control-plane.sh task")??;
        let client = plane.client().await?;
        let mut cluster = Self {
            name: name.to_owned(),
            dir: dir.clone(),
            bins: bins.to_owned(),
            plane,
            client,
            extender_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            extender: None,
            extender_config: String::new(),
            extender_kubeconfig: None,
            extender_identity: None,
            extender_starts: 0,
            failed: false,
        };
        cluster.pick_ports()?;
        eprintln!(
            "e2e {name}: control plane up in {:.1}s ({})",
            t0.elapsed().as_secs_f64(),
            dir.display()
        );
        Ok(cluster)
    }

    /// Runs `scripts/control-plane.sh <args[0]> <dir> <args[1..]>`, failing with its output.
    async fn control_plane(&self, args: &[&str]) -> Result<()> {
        self.plane.run_async(args, &[]).await
    }

    /// [`Cluster::control_plane`] with extra environment variables for the script.
    pub async fn control_plane_with_env(&self, args: &[&str], env: &[(&str, &str)]) -> Result<()> {
        self.plane.run_async(args, env).await
    }

    /// Path of the plane's admin kubeconfig.
    pub fn kubeconfig(&self) -> PathBuf {
        self.plane.kubeconfig()
    }

    /// The address kube-apiserver listens on.
    pub fn apiserver_addr(&self) -> Result<SocketAddr> {
        self.plane.apiserver_addr()
    }

    /// The status codes kube-apiserver answered to Binding creates for `pod`, oldest first,
    /// from its audit log (`control-plane.sh` audits Bindings only).
    pub fn audited_bindings(&self, pod: &str) -> Result<Vec<u16>> {
        Ok(self
            .audited_binding_events(pod)?
            .iter()
            .filter_map(|event| event["responseStatus"]["code"].as_u64())
            .map(|code| u16::try_from(code).unwrap_or(u16::MAX))
            .collect())
    }

    /// Who created `pod`'s Bindings (the users kube-apiserver authenticated), oldest first.
    pub fn audited_binders(&self, pod: &str) -> Result<Vec<String>> {
        Ok(self
            .audited_binding_events(pod)?
            .iter()
            .filter_map(|event| event["user"]["username"].as_str().map(str::to_owned))
            .collect())
    }

    /// The audit log's events of answered Binding creates for `pod`, oldest first.
    fn audited_binding_events(&self, pod: &str) -> Result<Vec<serde_json::Value>> {
        let path = self.dir.join("audit.log");
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        // The last line may be half written: only whole JSON lines count.
        Ok(text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|event| {
                let object = &event["objectRef"];
                object["subresource"] == "binding"
                    && object["name"] == pod
                    && event["responseStatus"]["code"].is_u64()
            })
            .collect())
    }

    /// Waits until kube-apiserver has answered a Binding create for `pod` with `code`.
    pub async fn wait_audited_binding(&self, pod: &str, code: u16) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let codes = self.audited_bindings(pod)?;
            if codes.contains(&code) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "kube-apiserver did not answer a Binding of {pod} with {code} within 20s (answers: {codes:?})"
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Makes the extender (from its next start) reach the API server at `addr` instead of
    /// directly: a copy of the admin kubeconfig with that server address.
    pub fn route_extender_through(&mut self, addr: SocketAddr) -> Result<()> {
        let direct = format!("https://{}", self.apiserver_addr()?);
        let text = std::fs::read_to_string(self.kubeconfig())?;
        ensure!(
            text.contains(&direct),
            "the kubeconfig does not name {direct}"
        );
        let path = self.dir.join("extender.kubeconfig");
        std::fs::write(&path, text.replace(&direct, &format!("https://{addr}")))
            .with_context(|| format!("writing {}", path.display()))?;
        self.extender_kubeconfig = Some(path);
        Ok(())
    }

    /// Makes the extender (from its next start) run as deploy/ runs it: as the Deployment's
    /// ServiceAccount `gpu-extender/gpu-scheduler`, with a token of its own, holding only the
    /// rights `deploy/rbac-extender.yaml` grants, under deploy/'s admission policies (the record
    /// policy, and the pod-write policy that holds the account's pod updates to the requeue
    /// annotation). Returns once the pod-write policy refuses another change from that account.
    pub async fn run_extender_as_deployed(&mut self) -> Result<()> {
        for file in [
            "namespace.yaml",
            "serviceaccount.yaml",
            "rbac-extender.yaml",
            "record-policy.yaml",
            "pod-write-policy.yaml",
        ] {
            self.kubectl(&["apply", "-f", &format!("{ROOT}/deploy/{file}")])
                .await?;
        }
        let token = self
            .kubectl(&[
                "-n",
                DEPLOYED_NAMESPACE,
                "create",
                "token",
                DEPLOYED_ACCOUNT,
                "--duration=2h",
            ])
            .await?;
        self.extender_identity = Some(
            self.plane
                .kubeconfig_with_token("extender-as-deployed.kubeconfig", &token)?,
        );

        // A policy takes effect once the API server has compiled it: a pod no scheduler serves,
        // labelled (a dry run) as the account until that is refused.
        let probe = "pod-write-policy-probe";
        let manifest = self.dir.join(format!("{probe}.yaml"));
        std::fs::write(
            &manifest,
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {probe}, namespace: default}}\n\
                 spec: {{schedulerName: none, containers: [{{name: c, image: registry.invalid/none:1}}]}}\n"
            ),
        )?;
        self.kubectl(&["create", "-f", &manifest.to_string_lossy()])
            .await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let refusal = self
                .kubectl(&[
                    "--as",
                    DEPLOYED_USER,
                    "--as-group=system:serviceaccounts",
                    "-n",
                    "default",
                    "label",
                    "--dry-run=server",
                    "pod",
                    probe,
                    "probe=yes",
                ])
                .await;
            match refusal {
                Err(error) if format!("{error:#}").contains("may update a pod only") => break,
                Err(error) => bail!("labelling as {DEPLOYED_USER} failed otherwise: {error:#}"),
                Ok(_) => ensure!(
                    Instant::now() < deadline,
                    "the pod-write policy did not take effect in 30s"
                ),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.kubectl(&["-n", "default", "delete", "pod", probe, "--wait=false"])
            .await?;
        Ok(())
    }

    /// Stops kube-apiserver, leaves it down for `down`, and starts it again on the same port
    /// (`control-plane.sh apiserver-restart`); returns once it is ready.
    pub async fn restart_apiserver(&self, down: Duration) -> Result<()> {
        let t0 = Instant::now();
        self.control_plane(&["apiserver-restart", &down.as_secs().to_string()])
            .await?;
        eprintln!(
            "e2e {}: kube-apiserver restarted in {:.1}s ({}s down on purpose)",
            self.name,
            t0.elapsed().as_secs_f64(),
            down.as_secs()
        );
        Ok(())
    }

    /// Writes the extender's configuration file (YAML; empty means every key at its default).
    /// The admin pages are opened (`server.adminAuth.paths: []`) unless the scenario's
    /// configuration sets `server.adminAuth` itself: the scenarios read `/inspect` with no token.
    fn write_extender_config(&self) -> Result<PathBuf> {
        let path = self.dir.join("extender.yaml");
        let mut config: serde_yaml_ng::Value = if self.extender_config.trim().is_empty() {
            serde_yaml_ng::Value::Mapping(serde_yaml_ng::Mapping::new())
        } else {
            serde_yaml_ng::from_str(&self.extender_config).context("the scenario's config")?
        };
        let root = config
            .as_mapping_mut()
            .ok_or_else(|| anyhow!("the scenario's config is not a mapping"))?;
        let server = root
            .entry("server".into())
            .or_insert_with(|| serde_yaml_ng::Value::Mapping(serde_yaml_ng::Mapping::new()))
            .as_mapping_mut()
            .ok_or_else(|| anyhow!("the scenario's server config is not a mapping"))?;
        if !server.contains_key("adminAuth") {
            server.insert(
                "adminAuth".into(),
                serde_yaml_ng::from_str("{paths: []}").context("adminAuth")?,
            );
        }
        // In a pod the writer Lease's namespace is the account's own, read from its files; here
        // it is said, and it is where the writer Lease's Role lets the account write.
        if self.extender_identity.is_some() && !root.contains_key("writerLease") {
            root.insert(
                "writerLease".into(),
                serde_yaml_ng::from_str(&format!("{{namespace: {DEPLOYED_NAMESPACE}}}"))
                    .context("writerLease")?,
            );
        }
        std::fs::write(&path, serde_yaml_ng::to_string(&config)?)
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// Starts the extender with `config` (a gpu-extender YAML configuration; empty for the
    /// defaults) and waits until it reports ready.
    pub async fn start_extender(&mut self, config: &str) -> Result<()> {
        self.extender_config = config.to_owned();
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.spawn_extender().await {
                // Someone took a port since it was chosen: choose again (nothing points at the
                // extender yet).
                Err(error) if attempt < 3 && format!("{error:#}").contains("in use") => {
                    eprintln!("e2e {}: port clash, retrying: {error:#}", self.name);
                    self.pick_ports()?;
                }
                other => return other,
            }
        }
    }

    /// Two distinct free ports for the extender's listeners.
    fn pick_ports(&mut self) -> Result<()> {
        let extender = free_port()?;
        let mut admin = free_port()?;
        while admin == extender {
            admin = free_port()?;
        }
        self.extender_addr = SocketAddr::from(([127, 0, 0, 1], extender));
        self.admin_addr = SocketAddr::from(([127, 0, 0, 1], admin));
        Ok(())
    }

    /// Starts the extender again with the same configuration and ports.
    pub async fn restart_extender(&mut self) -> Result<()> {
        self.kill_extender()?;
        self.spawn_extender().await
    }

    async fn spawn_extender(&mut self) -> Result<()> {
        ensure!(self.extender.is_none(), "the extender is already running");
        let config = self.write_extender_config()?;
        self.extender_starts += 1;
        let kubeconfig = self
            .extender_identity
            .clone()
            .or_else(|| self.extender_kubeconfig.clone())
            .unwrap_or_else(|| self.kubeconfig());
        let t0 = Instant::now();
        let child = launch_extender(&ExtenderLaunch {
            log: &self.dir.join("extender.log"),
            config: &config,
            kubeconfig: &kubeconfig,
            listen: self.extender_addr,
            admin: self.admin_addr,
            start: self.extender_starts,
        })
        .await?;
        self.extender = Some(ExtenderProc { child });
        eprintln!(
            "e2e {}: extender ready in {:.1}s (start #{})",
            self.name,
            t0.elapsed().as_secs_f64(),
            self.extender_starts
        );
        Ok(())
    }

    /// The running extender's process id.
    pub fn extender_pid(&self) -> Option<u32> {
        self.extender.as_ref().map(|proc| proc.child.id())
    }

    /// Kills the extender with SIGKILL (a crash: nothing is flushed or released).
    pub fn kill_extender(&mut self) -> Result<()> {
        if let Some(mut proc) = self.extender.take() {
            proc.child.kill().ok();
            proc.child
                .wait()
                .context("waiting for the killed extender")?;
        }
        Ok(())
    }

    /// Stops the extender gracefully (SIGTERM, then SIGKILL after 10 s).
    pub fn stop_extender(&mut self) {
        if let Some(mut proc) = self.extender.take() {
            let pid = proc.child.id().to_string();
            let _ = Command::new("kill")
                .args(["-TERM", &pid])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match proc.child.try_wait() {
                    Ok(Some(_)) | Err(_) => return,
                    Ok(None) if Instant::now() > deadline => {
                        eprintln!(
                            "e2e {}: extender ignored SIGTERM for 10s, killing",
                            self.name
                        );
                        proc.child.kill().ok();
                        proc.child.wait().ok();
                        return;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        }
    }

    /// Starts (or restarts) kube-scheduler with a shipped configuration file from the repository
    /// (e.g. [`PROFILE_CONFIG`]), pointed at this cluster's extender and kubeconfig.
    pub async fn start_scheduler(&self, shipped: &str) -> Result<()> {
        self.start_scheduler_with_flags(shipped, &[]).await
    }

    /// [`Cluster::start_scheduler`] with extra kube-scheduler command-line flags (feature gates).
    pub async fn start_scheduler_with_flags(&self, shipped: &str, flags: &[&str]) -> Result<()> {
        let rendered = self.rendered_scheduler_config(shipped, &self.extender_url())?;
        self.start_scheduler_rendered(shipped, &rendered, flags)
            .await
    }

    /// A shipped scheduler configuration (e.g. [`PROFILE_CONFIG`]) as [`render_scheduler_config`]
    /// points it at `url` and this cluster's kubeconfig.
    pub fn rendered_scheduler_config(&self, shipped: &str, url: &str) -> Result<String> {
        let text = std::fs::read_to_string(Path::new(ROOT).join(shipped))
            .with_context(|| format!("reading {shipped}"))?;
        render_scheduler_config(&text, url).with_context(|| format!("rendering {shipped}"))
    }

    /// Starts (or restarts) kube-scheduler with `rendered`, a configuration made from the shipped
    /// file `shipped` (named in the file written and in the log).
    pub async fn start_scheduler_rendered(
        &self,
        shipped: &str,
        rendered: &str,
        flags: &[&str],
    ) -> Result<()> {
        let file = Path::new(shipped)
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_else(|| "scheduler.yaml".to_owned());
        let path = self.dir.join(format!("rendered-{file}"));
        std::fs::write(&path, rendered)?;
        let t0 = Instant::now();
        self.plane.start_scheduler(&path, flags).await?;
        eprintln!(
            "e2e {}: kube-scheduler up with {shipped} in {:.1}s",
            self.name,
            t0.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// Starts kube-controller-manager running only `controllers` (its `--controllers` names, e.g.
    /// `deployment-controller`, `replicaset-controller`; `control-plane.sh controller-manager`),
    /// as admin, without leader election. The other scenarios run without it; the node
    /// lifecycle controller is never among them here, as the plane's nodes have no kubelets.
    pub async fn start_controller_manager(&self, controllers: &[&str]) -> Result<()> {
        let t0 = Instant::now();
        self.control_plane(&["controller-manager", &controllers.join(",")])
            .await?;
        eprintln!(
            "e2e {}: kube-controller-manager up ({}) in {:.1}s",
            self.name,
            controllers.join(","),
            t0.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// Starts kwok (`control-plane.sh kwok`): nodes annotated `kwok.x-k8s.io/node=fake` become
    /// Ready and keep heartbeating, their pods Running, and deleted pods go.
    pub async fn start_kwok(&self) -> Result<()> {
        let bins = self.autoscaler_bins()?;
        self.control_plane_with_env(&["kwok"], &[("AUTOSCALER_BIN_DIR", &bins)])
            .await
    }

    /// Starts cluster-autoscaler with its kwok provider (`control-plane.sh autoscaler`):
    /// `templates` (a v1 `List` of node templates, one node group per instance type) goes into
    /// the provider's templates ConfigMap, and the priority expander prefers the groups in the
    /// order of the list (the first highest), so a pod gets the first instance type that holds
    /// it. `flags` come after [`AUTOSCALER_FLAGS`] and override them.
    pub async fn start_autoscaler(
        &self,
        templates: &serde_json::Value,
        flags: &[&str],
    ) -> Result<()> {
        let bins = self.autoscaler_bins()?;
        let path = self.dir.join("node-templates.yaml");
        std::fs::write(&path, serde_yaml_ng::to_string(templates)?)
            .with_context(|| format!("writing {}", path.display()))?;
        let priorities = self.dir.join("expander-priorities.yaml");
        std::fs::write(&priorities, expander_priorities(templates)?)
            .with_context(|| format!("writing {}", priorities.display()))?;
        let flags: Vec<&str> = AUTOSCALER_FLAGS.iter().chain(flags).copied().collect();
        self.control_plane_with_env(
            &[
                "autoscaler",
                &path.to_string_lossy(),
                &priorities.to_string_lossy(),
            ],
            &[
                ("AUTOSCALER_BIN_DIR", &bins),
                ("CP_AUTOSCALER_EXTRA_ARGS", &flags.join(" ")),
            ],
        )
        .await
    }

    /// The lines of cluster-autoscaler's log that contain `needle`.
    pub fn autoscaler_log(&self, needle: &str) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("autoscaler.log"))
            .unwrap_or_default()
            .lines()
            .filter(|line| line.contains(needle))
            .map(str::to_owned)
            .collect()
    }

    fn autoscaler_bins(&self) -> Result<String> {
        match autoscaler_bins() {
            Bins::Ready(dir) => Ok(dir.to_string_lossy().into_owned()),
            Bins::Missing(why) => bail!(
                "no autoscaler components ({why}): run `make test`, or set {AUTOSCALER_BIN_ENV} \
                 to a directory with kwok and cluster-autoscaler (scripts/autoscaler-bins.sh builds them)"
            ),
        }
    }

    /// Stops kube-scheduler only.
    pub async fn stop_scheduler(&self) -> Result<()> {
        self.control_plane(&["scheduler-stop"]).await
    }

    /// The extender's base URL as kube-scheduler reaches it.
    pub fn extender_url(&self) -> String {
        format!("http://{}/scheduler", self.extender_addr)
    }

    /// GETs a path on the extender's admin listener; fails unless it answers 200.
    pub async fn admin_get(&self, path: &str) -> Result<String> {
        let (status, body) = http_get(self.admin_addr, path).await?;
        ensure!(status == 200, "GET {path}: status {status}: {body}");
        Ok(body)
    }

    /// The extender's `/metrics` text.
    pub async fn metrics(&self) -> Result<String> {
        self.admin_get("/metrics").await
    }

    /// The extender's `/inspect` report.
    pub async fn inspect(&self) -> Result<serde_json::Value> {
        let body = self.admin_get("/inspect").await?;
        serde_json::from_str(&body).context("decoding /inspect")
    }

    /// Runs the plane's kubectl with the admin kubeconfig; returns stdout.
    pub async fn kubectl(&self, args: &[&str]) -> Result<String> {
        let mut command = Command::new(self.bins.join("kubectl"));
        command
            .arg("--kubeconfig")
            .arg(
                self.extender_kubeconfig
                    .clone()
                    .unwrap_or_else(|| self.kubeconfig()),
            )
            .arg("--request-timeout=20s")
            .args(args)
            .stdin(Stdio::null());
        let output = tokio::task::spawn_blocking(move || command.output())
            .await
            .context("kubectl task")?
            .context("running kubectl")?;
        ensure!(
            output.status.success(),
            "kubectl {} failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// How many lines of kube-scheduler's log contain `needle`.
    pub fn scheduler_log_count(&self, needle: &str) -> usize {
        self.log_count("kube-scheduler.log", &[needle])
    }

    /// How many lines of the log `file` (in the plane's directory) contain every one of
    /// `needles`.
    pub fn log_count(&self, file: &str, needles: &[&str]) -> usize {
        std::fs::read_to_string(self.dir.join(file))
            .unwrap_or_default()
            .lines()
            .filter(|line| needles.iter().all(|needle| line.contains(needle)))
            .count()
    }

    /// Fails if the extender logged a panic (a handler or task that died, even if the process
    /// went on serving).
    fn check_extender_log(&self) -> Result<()> {
        let path = self.dir.join("extender.log");
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.contains("panicked at")) {
            bail!("the extender panicked: {line}");
        }
        Ok(())
    }

    fn print_logs(&self) {
        // The Karmada components' logs (`control-plane.sh karmada`), where a plane has them.
        let mut karmada: Vec<(String, usize)> = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .filter(|name| name.starts_with("karmada-") && name.ends_with(".log"))
            .map(|name| (name, 30))
            .collect();
        karmada.sort();
        let fixed = [
            ("extender.log", 60),
            ("kube-scheduler.log", 40),
            ("autoscaler.log", 30),
            ("kube-controller-manager.log", 20),
            ("kwok.log", 10),
            ("kube-apiserver.log", 15),
        ]
        .map(|(file, lines)| (file.to_owned(), lines));
        for (file, lines) in fixed.into_iter().chain(karmada) {
            let path = self.dir.join(&file);
            if path.exists() {
                eprintln!(
                    "----- {} (last {lines} lines)\n{}",
                    path.display(),
                    tail_file(&path, lines)
                );
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let failed = self.failed || std::thread::panicking();
        if failed {
            self.print_logs();
        }
        self.stop_extender();
        // The plane stops itself (and removes its directory unless kept) when it is dropped,
        // right after this.
        if failed && !std::thread::panicking() && std::env::var(KEEP_ENV).as_deref() != Ok("1") {
            eprintln!(
                "e2e {}: removing {} (set {KEEP_ENV}=1 to keep it)",
                self.name,
                self.dir.display()
            );
        }
    }
}

/// cluster-autoscaler's flags in every scenario: seconds instead of its production minutes. A
/// scenario adds the scan interval and its scale-down times.
pub const AUTOSCALER_FLAGS: [&str; 5] = [
    // A node it added is counted as coming up for at most this long.
    "--max-node-provision-time=60s",
    // Taint, then delete at once; look again soon at a node it could not remove.
    "--node-delete-delay-after-taint=0s",
    "--unremovable-node-recheck-timeout=5s",
    "--scale-down-delay-after-failure=5s",
    "--scale-down-delay-after-delete=0s",
];

/// The priority expander's configuration (ConfigMap `cluster-autoscaler-priority-expander`,
/// key `priorities`) for `templates`: each node group (instance type) by its place in the list,
/// the first highest.
pub fn expander_priorities(templates: &serde_json::Value) -> Result<String> {
    let items = templates["items"]
        .as_array()
        .context("the templates are not a List")?;
    let mut lines = Vec::new();
    for (place, item) in items.iter().enumerate() {
        let instance = item["metadata"]["labels"]["node.kubernetes.io/instance-type"]
            .as_str()
            .with_context(|| format!("template {place} has no instance type"))?;
        let escaped = instance.replace('.', "\\.");
        lines.push(format!(
            "{}:\n  - '^{escaped}$'",
            (items.len() - place) * 10
        ));
    }
    Ok(lines.join("\n") + "\n")
}

/// What [`launch_extender`] starts: one gpu-extender process of this test target's binary.
pub struct ExtenderLaunch<'a> {
    /// Log file (appended to: stdout and stderr).
    pub log: &'a Path,
    /// The YAML configuration file.
    pub config: &'a Path,
    pub kubeconfig: &'a Path,
    /// The extender listener (kube-scheduler's urlPrefix).
    pub listen: SocketAddr,
    /// The admin listener (/readyz, /metrics, /inspect).
    pub admin: SocketAddr,
    /// Which start this is (written to the log).
    pub start: u32,
}

/// Starts `gpu-extender serve` as `launch` says, with debug logs, and waits until it reports
/// ready (60 s at most); see [`gpu_test_support::plane::launch_extender`].
pub async fn launch_extender(launch: &ExtenderLaunch<'_>) -> Result<Child> {
    gpu_test_support::plane::launch_extender(&Launch {
        binary: Path::new(EXTENDER_BIN),
        log: launch.log,
        config: launch.config,
        kubeconfig: launch.kubeconfig,
        listen: launch.listen,
        admin: launch.admin,
        args: &[],
        env: &[(
            "RUST_LOG",
            "info,gpu_extender=debug,kube_runtime=warn,kube_client=warn",
        )],
        start: launch.start,
        ready_within: Duration::from_secs(60),
    })
    .await
}

/// The shipped scheduler configuration, pointed at a test extender: the shipped extender URL
/// becomes `url` and the shipped kubeconfig path `__KUBECONFIG__` (for control-plane.sh).
pub fn render_scheduler_config(shipped: &str, url: &str) -> Result<String> {
    ensure!(
        shipped.contains(SHIPPED_EXTENDER_URL),
        "no extender URL {SHIPPED_EXTENDER_URL} to rewrite"
    );
    ensure!(
        shipped.contains(SHIPPED_KUBECONFIG),
        "no kubeconfig {SHIPPED_KUBECONFIG} to rewrite"
    );
    Ok(shipped
        .replace(SHIPPED_EXTENDER_URL, url)
        .replace(SHIPPED_KUBECONFIG, "__KUBECONFIG__"))
}

/// Every (node, GPU, pod) holding in an `/inspect` report.
pub fn table_holdings(
    report: &serde_json::Value,
) -> std::collections::BTreeSet<(String, u16, String)> {
    let mut out = std::collections::BTreeSet::new();
    for node in report["nodes"].as_array().into_iter().flatten() {
        let name = node["name"].as_str().unwrap_or_default();
        for gpu in node["gpus"].as_array().into_iter().flatten() {
            let index =
                u16::try_from(gpu["index"].as_u64().unwrap_or(u64::MAX)).unwrap_or(u16::MAX);
            for pod in gpu["pods"].as_array().into_iter().flatten() {
                if let Some(pod) = pod.as_str() {
                    let pod = pod.rsplit('/').next().unwrap_or(pod);
                    out.insert((name.to_owned(), index, pod.to_owned()));
                }
            }
        }
    }
    out
}
