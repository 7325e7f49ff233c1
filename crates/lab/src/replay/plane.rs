//! The processes a loopback replay runs: etcd and kube-apiserver through the workspace's one
//! control-plane driver (`gpu_test_support::plane`, which the end-to-end tests use too), the
//! gpu-extender binary, and kube-scheduler with a configuration made from the shipped profile.
//! Owns the replay's choices about them (the scheduler's configuration, HTTPS to the extender)
//! and their CPU accounting; everything started is stopped and the working directory removed
//! when the [`Plane`] is dropped, also on error.

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use serde_yaml_ng::Value;

use gpu_extender::config::Config;
use gpu_test_support::plane::{ControlPlane, ExtenderLaunch, launch_extender};
use gpu_test_support::port::free_addr;

/// The shipped scheduler configuration with both profiles (`default-scheduler` and
/// `gpu-scheduler`): the throughput baseline runs it without its extender.
pub const SHIPPED_PROFILE: &str =
    include_str!("../../../../scheduler-config/gpu-scheduler-profile.yaml");
/// The shipped configuration of a dedicated GPU kube-scheduler: what replays run unless given
/// another file.
pub const DEDICATED_PROFILE: &str =
    include_str!("../../../../scheduler-config/gpu-scheduler-dedicated.yaml");
/// The profile GPU pods select in the shipped configuration.
pub const GPU_SCHEDULER: &str = "gpu-scheduler";
/// The profile every kube-scheduler serves.
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// How kube-scheduler is configured for a replay.
#[derive(Clone, Debug)]
pub struct SchedulerSetup {
    /// The KubeSchedulerConfiguration to start from (YAML).
    pub base: String,
    /// Whether the extender stays in it (the throughput baseline removes it).
    pub with_extender: bool,
    /// `percentageOfNodesToScore`; `None` keeps the file's (kube-scheduler's adaptive default).
    pub percentage_of_nodes_to_score: Option<u32>,
    /// kube-scheduler's client QPS and burst; `None` keeps its defaults (50 / 100).
    pub client_qps: Option<u32>,
    /// DRA mode with the extender: its stanzas are replaced by the DRA stanza of docs/dra.md
    /// ([`dra_stanza`]), the extender ranking pods with GPU claims and deciding nothing else.
    pub dra_stanza: bool,
}

/// The extender stanza docs/dra.md gives for ranking pods with GPU claims (its `urlPrefix` is
/// filled in by [`SchedulerSetup::render`]): prioritize only, on `<urlPrefix>/dra`, no managed
/// resources (kube-scheduler calls it for every pod), ignorable.
pub fn dra_stanza() -> Value {
    let mut stanza = serde_yaml_ng::Mapping::new();
    stanza.insert("prioritizeVerb".into(), "prioritize".into());
    stanza.insert("weight".into(), gpu_sim::dra::EXTENDER_WEIGHT.into());
    stanza.insert("nodeCacheCapable".into(), true.into());
    stanza.insert("httpTimeout".into(), "5s".into());
    stanza.insert("ignorable".into(), true.into());
    Value::Sequence(vec![Value::Mapping(stanza)])
}

impl SchedulerSetup {
    /// The shipped dedicated GPU scheduler, unchanged apart from what the loopback plane needs.
    pub fn shipped() -> Self {
        Self {
            base: DEDICATED_PROFILE.to_owned(),
            with_extender: true,
            percentage_of_nodes_to_score: None,
            client_qps: None,
            dra_stanza: false,
        }
    }

    /// The configuration kube-scheduler gets: `base` with the plane's kubeconfig placeholder,
    /// no leader election, the extender's address (or no extender), and the overrides.
    pub fn render(&self, extender: Option<&ExtenderEndpoint>) -> Result<String> {
        let mut doc: Value =
            serde_yaml_ng::from_str(&self.base).context("the scheduler configuration")?;
        let root = doc
            .as_mapping_mut()
            .ok_or_else(|| anyhow!("the scheduler configuration is not a YAML mapping"))?;
        let mut connection = root
            .get("clientConnection")
            .cloned()
            .unwrap_or_else(|| Value::Mapping(Default::default()));
        if let Some(map) = connection.as_mapping_mut() {
            // control-plane.sh replaces the placeholder with the plane's scheduler kubeconfig.
            map.insert("kubeconfig".into(), "__KUBECONFIG__".into());
            if let Some(qps) = self.client_qps {
                map.insert("qps".into(), qps.into());
                map.insert("burst".into(), (qps * 2).into());
            }
        }
        root.insert("clientConnection".into(), connection);
        root.insert(
            "leaderElection".into(),
            serde_yaml_ng::from_str("leaderElect: false")?,
        );
        if let Some(percentage) = self.percentage_of_nodes_to_score {
            root.insert("percentageOfNodesToScore".into(), percentage.into());
        }
        match (self.with_extender, extender) {
            (true, Some(endpoint)) => {
                let path = if self.dra_stanza {
                    root.insert("extenders".into(), dra_stanza());
                    "/scheduler/dra"
                } else {
                    "/scheduler"
                };
                let extenders = root
                    .get_mut("extenders")
                    .and_then(Value::as_sequence_mut)
                    .ok_or_else(|| anyhow!("the scheduler configuration has no extenders"))?;
                let addr = endpoint.addr;
                for entry in extenders.iter_mut().filter_map(Value::as_mapping_mut) {
                    match &endpoint.ca_file {
                        None => {
                            entry.insert("urlPrefix".into(), format!("http://{addr}{path}").into());
                        }
                        Some(ca) => {
                            entry
                                .insert("urlPrefix".into(), format!("https://{addr}{path}").into());
                            entry.insert("enableHTTPS".into(), true.into());
                            let mut tls = serde_yaml_ng::Mapping::new();
                            tls.insert("caFile".into(), ca.display().to_string().into());
                            entry.insert("tlsConfig".into(), tls.into());
                        }
                    }
                }
            }
            (true, None) => bail!("the scheduler configuration needs the extender's address"),
            (false, _) => {
                root.remove("extenders");
            }
        }
        Ok(serde_yaml_ng::to_string(&doc)?)
    }
}

/// Where kube-scheduler reaches the extender: its address, and over HTTPS the CA that signed
/// its serving certificate.
#[derive(Clone, Debug)]
pub struct ExtenderEndpoint {
    /// The extender listener's address.
    pub addr: SocketAddr,
    /// `Some` when the extender serves HTTPS: the CA file kube-scheduler trusts.
    pub ca_file: Option<PathBuf>,
}

/// The files of an extender served over HTTPS on the plane: a CA of the replay's own and a
/// serving certificate for 127.0.0.1 it signed.
#[derive(Clone, Debug)]
pub struct ExtenderPki {
    /// The CA certificate kube-scheduler trusts.
    pub ca_file: PathBuf,
    /// The extender's serving certificate (`server.tls.certFile`).
    pub cert_file: PathBuf,
    /// Its key (`server.tls.keyFile`).
    pub key_file: PathBuf,
}

impl ExtenderPki {
    /// Makes the CA and the serving certificate in `dir` with `openssl` (which the plane's
    /// script needs already): P-256 keys, valid two days.
    pub fn make(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let pki = Self {
            ca_file: dir.join("ca.crt"),
            cert_file: dir.join("tls.crt"),
            key_file: dir.join("tls.key"),
        };
        let ca_key = dir.join("ca.key");
        let request = dir.join("tls.csr");
        let extensions = dir.join("tls.ext");
        std::fs::write(
            &extensions,
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        )
        .with_context(|| format!("writing {}", extensions.display()))?;
        let run = |args: &[&OsStr]| -> Result<()> {
            let output = Command::new("openssl")
                .args(args)
                .stdin(Stdio::null())
                .output()
                .context("running openssl (needed for --extender-https)")?;
            ensure!(
                output.status.success(),
                "openssl {} failed: {}",
                args.first()
                    .map(|a| a.to_string_lossy())
                    .unwrap_or_default(),
                String::from_utf8_lossy(&output.stderr).trim()
            );
            Ok(())
        };
        let o = OsStr::new;
        let new_key = [
            o("-newkey"),
            o("ec"),
            o("-pkeyopt"),
            o("ec_paramgen_curve:prime256v1"),
            o("-nodes"),
        ];
        let ca_subject = [o("-subj"), o("/CN=gpu-lab replay CA"), o("-days"), o("2")];
        let ca_out = [
            o("-keyout"),
            ca_key.as_os_str(),
            o("-out"),
            pki.ca_file.as_os_str(),
        ];
        run(&[&[o("req"), o("-x509")][..], &new_key, &ca_subject, &ca_out].concat())?;
        let leaf_out = [
            o("-subj"),
            o("/CN=127.0.0.1"),
            o("-keyout"),
            pki.key_file.as_os_str(),
            o("-out"),
            request.as_os_str(),
        ];
        run(&[&[o("req")][..], &new_key, &leaf_out].concat())?;
        run(&[
            o("x509"),
            o("-req"),
            o("-days"),
            o("2"),
            o("-CAcreateserial"),
            o("-in"),
            request.as_os_str(),
            o("-CA"),
            pki.ca_file.as_os_str(),
            o("-CAkey"),
            ca_key.as_os_str(),
            o("-extfile"),
            extensions.as_os_str(),
            o("-out"),
            pki.cert_file.as_os_str(),
        ])?;
        Ok(pki)
    }

    /// The extender's `--set` overrides that serve these files.
    pub fn overrides(&self) -> [String; 2] {
        [
            format!("server.tls.certFile={}", self.cert_file.display()),
            format!("server.tls.keyFile={}", self.key_file.display()),
        ]
    }
}

/// A loopback control plane and the extender; stopped and removed on drop.
#[derive(Debug)]
pub struct Plane {
    plane: ControlPlane,
    extender: Option<Child>,
    extender_addr: Option<SocketAddr>,
    admin_addr: Option<SocketAddr>,
    extender_starts: u32,
    /// Set by [`Plane::serve_extender_over_https`]: the extender serves these files and
    /// kube-scheduler calls it over HTTPS.
    extender_pki: Option<ExtenderPki>,
}

impl Plane {
    /// Starts etcd and kube-apiserver with the checkout's `scripts/control-plane.sh` (`repo` is
    /// the checkout) and the Kubernetes binaries in `bins`.
    pub fn start(repo: &Path, bins: &Path, keep: bool) -> Result<Self> {
        let script = repo.join("scripts/control-plane.sh");
        ensure!(
            script.is_file(),
            "{} is missing: the loopback control plane runs from a gpu-extender checkout (--repo), \
             or give --kubeconfig for a cluster of your own",
            script.display()
        );
        let dir = std::env::temp_dir().join(format!("gpu-extender-replay-{}", std::process::id()));
        Ok(Self {
            plane: ControlPlane::start(repo, bins, dir, &[], keep)?,
            extender: None,
            extender_addr: None,
            admin_addr: None,
            extender_starts: 0,
            extender_pki: None,
        })
    }

    /// From now on the extender serves HTTPS with a certificate made for the plane
    /// ([`ExtenderPki`]), and kube-scheduler calls it with `enableHTTPS` trusting its CA.
    pub fn serve_extender_over_https(&mut self) -> Result<()> {
        self.extender_pki = Some(ExtenderPki::make(&self.dir().join("extender-pki"))?);
        Ok(())
    }

    /// The plane's working directory (logs, configurations, pid files).
    pub fn dir(&self) -> &Path {
        self.plane.dir()
    }

    /// A client with the admin identity.
    pub async fn client(&self) -> Result<kube::Client> {
        self.plane.client().await
    }

    /// Starts the extender `binary` with `config` and `--set` overrides (`KEY=VALUE`); returns
    /// once it reports ready, that is once its table holds every node and pod the API server had.
    pub async fn start_extender(
        &mut self,
        binary: &Path,
        config: &Config,
        overrides: &[String],
    ) -> Result<SocketAddr> {
        ensure!(self.extender.is_none(), "the extender is already running");
        let listen = free_addr()?;
        let admin = free_addr()?;
        let config_path = self.dir().join("extender.yaml");
        std::fs::write(&config_path, config.to_yaml())
            .with_context(|| format!("writing {}", config_path.display()))?;
        let args: Vec<String> = self
            .extender_pki
            .iter()
            .flat_map(ExtenderPki::overrides)
            .chain(overrides.iter().cloned())
            .flat_map(|o| ["--set".to_owned(), o])
            .collect();
        self.extender_starts += 1;
        let child = launch_extender(&ExtenderLaunch {
            binary,
            log: &self.dir().join("extender.log"),
            config: &config_path,
            kubeconfig: &self.plane.kubeconfig(),
            listen,
            admin,
            args: &args,
            env: &[("GPU_EXTENDER_LOG", "warn")],
            start: self.extender_starts,
            ready_within: Duration::from_secs(120),
        })
        .await?;
        self.extender = Some(child);
        self.extender_addr = Some(listen);
        self.admin_addr = Some(admin);
        Ok(listen)
    }

    /// Stops the extender (SIGKILL: it keeps nothing that a restart would not rebuild).
    pub fn stop_extender(&mut self) {
        if let Some(mut child) = self.extender.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.extender_addr = None;
        self.admin_addr = None;
    }

    /// The running extender's metrics, in Prometheus text format.
    pub async fn extender_metrics(&self) -> Result<String> {
        let admin = self
            .admin_addr
            .ok_or_else(|| anyhow!("the extender is not running"))?;
        gpu_extender::http::client::http_get(&format!("http://{admin}/metrics")).await
    }

    /// (Re)starts kube-scheduler with `setup`, pointed at the running extender.
    pub async fn start_scheduler(&self, setup: &SchedulerSetup) -> Result<()> {
        let endpoint = self.extender_addr.map(|addr| ExtenderEndpoint {
            addr,
            ca_file: self.extender_pki.as_ref().map(|pki| pki.ca_file.clone()),
        });
        let rendered = setup.render(endpoint.as_ref())?;
        let path = self.dir().join("scheduler.yaml");
        std::fs::write(&path, rendered).with_context(|| format!("writing {}", path.display()))?;
        self.plane.start_scheduler(&path, &[]).await
    }

    /// Stops kube-scheduler.
    pub async fn stop_scheduler(&self) -> Result<()> {
        self.plane.stop_scheduler().await
    }

    /// Process ids of the plane's components, for CPU accounting.
    pub fn pids(&self) -> Vec<(&'static str, u32)> {
        let mut pids = self.plane.pids();
        if let Some(child) = &self.extender {
            pids.push(("gpu-extender", child.id()));
        }
        pids
    }
}

impl Drop for Plane {
    fn drop(&mut self) {
        // The control plane stops itself when its field is dropped, right after this.
        self.stop_extender();
    }
}

/// CPU time a process has spent (user + system), from `/proc/PID/stat`.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after its ')' are plain.
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the name.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // Linux reports these in USER_HZ, 100 on every architecture it runs on.
    Some(Duration::from_millis(ticks * 10))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_profile_renders_for_the_plane() {
        let setup = SchedulerSetup {
            percentage_of_nodes_to_score: Some(100),
            client_qps: Some(500),
            ..SchedulerSetup::shipped()
        };
        let addr = ExtenderEndpoint {
            addr: "127.0.0.1:4242".parse().unwrap(),
            ca_file: None,
        };
        let rendered: Value = serde_yaml_ng::from_str(&setup.render(Some(&addr)).unwrap()).unwrap();
        assert_eq!(rendered["percentageOfNodesToScore"], 100);
        assert!(
            rendered["extenders"][0].get("managedResources").is_none(),
            "the dedicated scheduler sends the extender every pod"
        );
        assert_eq!(rendered["clientConnection"]["qps"], 500);
        assert_eq!(rendered["clientConnection"]["kubeconfig"], "__KUBECONFIG__");
        assert_eq!(rendered["leaderElection"]["leaderElect"], false);
        assert_eq!(
            rendered["extenders"][0]["urlPrefix"],
            "http://127.0.0.1:4242/scheduler"
        );
        assert_eq!(rendered["extenders"][0]["weight"], 5, "the rest is kept");
        let kept: Value =
            serde_yaml_ng::from_str(&SchedulerSetup::shipped().render(Some(&addr)).unwrap())
                .unwrap();
        let file: Value = serde_yaml_ng::from_str(DEDICATED_PROFILE).unwrap();
        assert_eq!(
            kept["percentageOfNodesToScore"], file["percentageOfNodesToScore"],
            "without an override the file's window is kept"
        );

        let baseline = SchedulerSetup {
            base: SHIPPED_PROFILE.to_owned(),
            with_extender: false,
            ..SchedulerSetup::shipped()
        };
        let rendered: Value = serde_yaml_ng::from_str(&baseline.render(None).unwrap()).unwrap();
        assert!(rendered.get("extenders").is_none());
        assert!(rendered.get("percentageOfNodesToScore").is_none());
        assert!(
            SchedulerSetup::shipped().render(None).is_err(),
            "an extender config needs the extender"
        );
        assert!(rendered.get("enableHTTPS").is_none());

        let dra = SchedulerSetup {
            dra_stanza: true,
            ..SchedulerSetup::shipped()
        };
        let rendered: Value = serde_yaml_ng::from_str(&dra.render(Some(&addr)).unwrap()).unwrap();
        let stanzas = rendered["extenders"].as_sequence().unwrap();
        assert_eq!(stanzas.len(), 1, "the DRA stanza alone: {stanzas:?}");
        assert_eq!(
            stanzas[0]["urlPrefix"],
            "http://127.0.0.1:4242/scheduler/dra"
        );
        assert_eq!(stanzas[0]["prioritizeVerb"], "prioritize");
        assert_eq!(stanzas[0]["weight"], 5);
        assert_eq!(stanzas[0]["ignorable"], true);
        assert!(stanzas[0].get("filterVerb").is_none() && stanzas[0].get("bindVerb").is_none());
        assert!(stanzas[0].get("managedResources").is_none());

        let over_https = ExtenderEndpoint {
            ca_file: Some(PathBuf::from("/plane/extender-pki/ca.crt")),
            ..addr
        };
        let rendered: Value =
            serde_yaml_ng::from_str(&SchedulerSetup::shipped().render(Some(&over_https)).unwrap())
                .unwrap();
        let extender = &rendered["extenders"][0];
        assert_eq!(extender["urlPrefix"], "https://127.0.0.1:4242/scheduler");
        assert_eq!(extender["enableHTTPS"], true);
        assert_eq!(
            extender["tlsConfig"]["caFile"],
            "/plane/extender-pki/ca.crt"
        );
    }

    #[test]
    fn the_extender_pki_is_one_the_extender_serves() {
        if Command::new("openssl").arg("version").output().is_err() {
            eprintln!("SKIPPED: no openssl on this machine");
            return;
        }
        let dir = std::env::temp_dir().join(format!("gpu-extender-pki-{}", std::process::id()));
        let pki = ExtenderPki::make(&dir).unwrap();
        let files = gpu_extender::config::TlsConfig {
            cert_file: pki.cert_file.clone(),
            key_file: pki.key_file.clone(),
            ..gpu_extender::config::TlsConfig::default()
        };
        // Loads as `server.tls` does: the key goes with the certificate.
        gpu_extender::http::tls::Reloader::load(&files, gpu_extender::http::tls::Served::Extender)
            .unwrap();
        let ca = std::fs::read_to_string(&pki.ca_file).unwrap();
        assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");
        assert_eq!(
            pki.overrides()[0],
            format!("server.tls.certFile={}", pki.cert_file.display())
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn cpu_time_reads_this_process() {
        let pid = std::process::id();
        assert!(cpu_time(pid).is_some());
        assert!(cpu_time(u32::MAX).is_none());
    }
}
