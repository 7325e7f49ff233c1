//! `deploy/` against the real components it targets: rendered by `kubectl kustomize`, applied to
//! a real kube-apiserver (server-side dry run, then for real), the extender configuration it
//! ships checked by `gpu-extender check-config`, and the KubeSchedulerConfiguration it ships run
//! by a real kube-scheduler, which must come up healthy and win its leader election with the
//! Role `deploy/` gives it. The Helm chart `deploy/helm/gpu-extender` is held to the same objects
//! (`helm template` against `kubectl kustomize`), linted, fed bad values, dry-run and installed
//! against the same kube-apiserver.
//!
//! Needs the Kubernetes binaries (`scripts/k8s-bins.sh`): `$GPU_TEST_K8S_BIN`, else
//! `${GPU_TEST_CACHE:-~/.cache/gpu-extender}/k8s/<version>/bin`. The tests that need them are
//! `#[ignore]`d (a plain `cargo test` counts them as ignored); `make test` runs them with
//! `--ignored`, and run without the binaries they fail saying how to get them. The control plane comes from
//! `scripts/control-plane.sh` (RBAC authorization, static tokens; docs/real-cluster-tooling.md).
//!
//! The chart's tests need helm: `$GPU_TEST_HELM` (`scripts/helm.sh` builds it; `make test-e2e`
//! sets it). Without it they fail under `GPU_TEST_E2E=require` and are skipped, saying so,
//! otherwise.
//!
//! The ServiceMonitor in `deploy/monitoring/` needs the Prometheus Operator CRD, which the test
//! plane lacks: point `GPU_TEST_SERVICEMONITOR_CRD` at the CRD's YAML
//! (`monitoring.coreos.com_servicemonitors.yaml` from prometheus-operator) to have it installed and
//! the ServiceMonitor dry-run against it; otherwise kubectl only parses it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a panic is a test failure with its location"
)]

mod support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use gpu_test_support::plane::ControlPlane;
use gpu_test_support::port::free_port;
use serde_yaml_ng::Value;
use support::api_calls;
use support::manifests::{describe, find, kind, label, name, namespace, parse_documents};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const EXTENDER_BIN: &str = env!("CARGO_BIN_EXE_gpu-extender");
const BIN_ENV: &str = "GPU_TEST_K8S_BIN";
const CRD_ENV: &str = "GPU_TEST_SERVICEMONITOR_CRD";

/// The routes the extender serves under its URL prefix (`src/http/server.rs`, `router`).
const EXTENDER_VERBS: &[&str] = &["filter", "prioritize", "bind", "preempt"];
/// The profile GPU pods select.
const PROFILE: &str = "gpu-scheduler";

// ---------------------------------------------------------------------------------------------
// Binaries, rendering, processes

/// The Kubernetes version the test binaries are built from (`tests/k8s-bins/go.mod`).
fn k8s_version() -> String {
    let go_mod = std::fs::read_to_string(Path::new(ROOT).join("tests/k8s-bins/go.mod")).unwrap();
    go_mod
        .lines()
        .find_map(|line| {
            // `require k8s.io/kubernetes v1.34.4`, or the same inside a require ( ... ) block
            let line = line.trim().trim_start_matches("require").trim();
            line.strip_prefix("k8s.io/kubernetes ")
                .map(|version| version.trim().to_owned())
        })
        .expect("tests/k8s-bins/go.mod requires k8s.io/kubernetes")
}

/// The directory with etcd, kube-apiserver, kube-scheduler and kubectl, or a failure saying why it
/// is missing: a test that was asked to run and cannot is a failure, never a pass.
fn k8s_bins(test: &str) -> PathBuf {
    static BINS: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let found = BINS.get_or_init(|| {
        let dir = match std::env::var_os(BIN_ENV) {
            Some(dir) => PathBuf::from(dir),
            None => {
                let cache = std::env::var_os("GPU_TEST_CACHE")
                    .map(PathBuf::from)
                    .or_else(|| {
                        std::env::var_os("HOME")
                            .map(|h| PathBuf::from(h).join(".cache/gpu-extender"))
                    })
                    .unwrap_or_default();
                cache.join("k8s").join(k8s_version()).join("bin")
            }
        };
        let missing: Vec<&str> = ["etcd", "kube-apiserver", "kube-scheduler", "kubectl"]
            .into_iter()
            .filter(|b| !dir.join(b).is_file())
            .collect();
        if missing.is_empty() {
            Ok(dir)
        } else {
            Err(format!(
                "{} missing in {} (build them with scripts/k8s-bins.sh, or set {BIN_ENV})",
                missing.join(", "),
                dir.display()
            ))
        }
    });
    match found {
        Ok(dir) => dir.clone(),
        Err(why) => panic!("{test}: needs the Kubernetes binaries: {why}"),
    }
}

/// Runs `program args`, feeding `stdin`.
fn run(mut command: Command, stdin: Option<&str>) -> Output {
    let shown = format!("{command:?}");
    command
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"));
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(input.as_bytes()).unwrap();
    }
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `kubectl kustomize <dir>` (kubectl's built-in kustomize, as `kubectl apply -k` uses).
fn kustomize(bins: &Path, dir: &str) -> String {
    let mut command = Command::new(bins.join("kubectl"));
    command.arg("kustomize").arg(Path::new(ROOT).join(dir));
    let out = run(command, None);
    assert!(
        out.status.success(),
        "kubectl kustomize {dir} failed:\n{}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Tests here share one machine's two cores with everything else; the plane test runs alone.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

// ---------------------------------------------------------------------------------------------
// The rendered base, and the pieces tests look at

struct Rendered {
    objects: Vec<Value>,
    text: String,
}

impl Rendered {
    fn base(bins: &Path) -> Self {
        let text = kustomize(bins, "deploy");
        let objects = parse_documents(&text, "kubectl kustomize deploy");
        Self { objects, text }
    }

    fn deployment(&self) -> &Value {
        let found: Vec<&Value> = self
            .objects
            .iter()
            .filter(|o| kind(o) == "Deployment")
            .collect();
        assert_eq!(found.len(), 1, "one Deployment expected");
        found[0]
    }

    fn pod_spec(&self) -> &Value {
        &self.deployment()["spec"]["template"]["spec"]
    }

    /// The Deployment's ServiceAccount: (namespace, name).
    fn service_account(&self) -> (String, String) {
        let account = self.pod_spec()["serviceAccountName"]
            .as_str()
            .expect("the Deployment names its serviceAccountName");
        (namespace(self.deployment()).to_owned(), account.to_owned())
    }

    /// Every container of the pod, sidecars (restartable init containers) included.
    fn containers(&self) -> Vec<&Value> {
        let spec = self.pod_spec();
        ["initContainers", "containers"]
            .iter()
            .flat_map(|key| spec[*key].as_sequence().into_iter().flatten())
            .collect()
    }

    fn container(&self, wanted: &str) -> &Value {
        self.containers()
            .into_iter()
            .find(|c| c["name"].as_str() == Some(wanted))
            .unwrap_or_else(|| panic!("no container {wanted} in the Deployment"))
    }

    /// The text of the file `container` reads from `--config=PATH`, found through its volume
    /// mount, the volume and the (kustomize-generated) ConfigMap.
    fn config_file_of(&self, container: &str) -> String {
        let c = self.container(container);
        let args: Vec<&str> = ["command", "args"]
            .iter()
            .flat_map(|k| c[*k].as_sequence().into_iter().flatten())
            .filter_map(Value::as_str)
            .collect();
        let path = args
            .iter()
            .find_map(|a| a.strip_prefix("--config="))
            .unwrap_or_else(|| {
                panic!("container {container} has no --config=PATH argument: {args:?}")
            });
        let (dir, file) = path.rsplit_once('/').unwrap();
        let mount = c["volumeMounts"]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|m| m["mountPath"].as_str() == Some(dir))
            .unwrap_or_else(|| panic!("container {container}: nothing mounted at {dir}"));
        let volume_name = mount["name"].as_str().unwrap();
        let volume = self.pod_spec()["volumes"]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|v| v["name"].as_str() == Some(volume_name))
            .unwrap_or_else(|| panic!("no volume {volume_name}"));
        let config_map = volume["configMap"]["name"]
            .as_str()
            .unwrap_or_else(|| panic!("volume {volume_name} is not a ConfigMap"));
        // An items list maps keys to paths; without one, each key is a file.
        let key = volume["configMap"]["items"]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|i| i["path"].as_str() == Some(file))
            .and_then(|i| i["key"].as_str())
            .unwrap_or(file);
        let map = find(&self.objects, "ConfigMap", config_map);
        assert_eq!(namespace(map), namespace(self.deployment()));
        map["data"][key]
            .as_str()
            .unwrap_or_else(|| panic!("ConfigMap {config_map} has no key {key}"))
            .to_owned()
    }

    fn scheduler_config(&self) -> Value {
        serde_yaml_ng::from_str(&self.config_file_of("kube-scheduler")).unwrap()
    }

    fn extender_config_text(&self) -> String {
        self.config_file_of("gpu-extender")
    }

    /// The container port number a probe or Service names (`admin` or `9090`).
    fn port_number(&self, container: &Value, port: &Value) -> u64 {
        match port {
            Value::Number(n) => n.as_u64().unwrap(),
            Value::String(named) => container["ports"]
                .as_sequence()
                .into_iter()
                .flatten()
                .find(|p| p["name"].as_str() == Some(named))
                .and_then(|p| p["containerPort"].as_u64())
                .unwrap_or_else(|| panic!("no container port named {named}")),
            other => panic!("not a port: {other:?}"),
        }
    }
}

/// The configuration the extender really runs with: `check-config` prints it after applying
/// defaults (and `env`, the container's GPU_EXTENDER_* variables). Panics with check-config's
/// message if the file is refused.
fn effective_extender_config(config_text: &str, scratch: &Path, env: &[(String, String)]) -> Value {
    let file = scratch.join("gpu-extender-config.yaml");
    std::fs::write(&file, config_text).unwrap();
    let mut command = Command::new(EXTENDER_BIN);
    command.arg("check-config").arg("--config").arg(&file);
    // Only the file counts, not this environment's GPU_EXTENDER_* variables.
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("GPU_EXTENDER_") {
            command.env_remove(key);
        }
    }
    command.envs(env.iter().map(|(k, v)| (k, v)));
    let out = run(command, None);
    assert!(
        out.status.success(),
        "gpu-extender check-config refuses the configuration in the ConfigMap:\n{}",
        text(&out.stderr)
    );
    serde_yaml_ng::from_str(&text(&out.stdout))
        .expect("check-config prints the configuration as YAML")
}

fn scratch_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpu-extender-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn selector_matches(selector: &Value, labels: &Value) -> bool {
    let selector = selector.as_mapping().expect("a label selector");
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

// ---------------------------------------------------------------------------------------------
// Static checks on the rendering (kubectl only)

#[test]
#[ignore = "needs the Kubernetes binaries; make test runs it, or cargo test --test deploy_manifests -- --ignored"]
fn extender_config_in_the_config_map_passes_check_config() {
    let bins = k8s_bins("extender_config_in_the_config_map_passes_check_config");
    let rendered = Rendered::base(&bins);
    let scratch = scratch_dir("check-config");
    let config = effective_extender_config(&rendered.extender_config_text(), &scratch, &[]);
    assert!(config["server"]["listen"].is_string());
    let _ = std::fs::remove_dir_all(scratch);
}

/// deploy/ with the karmada-estimator component added, as `kustomize edit add component` leaves
/// it, rendered by `kubectl kustomize` (the kustomization is written into `scratch`).
fn kustomize_with_karmada_estimator(bins: &Path, scratch: &Path) -> String {
    kustomize_with_component(bins, scratch, "karmada-estimator")
}

/// deploy/ with the component `deploy/<component>` added, as `kustomize edit add component`
/// leaves it, rendered by `kubectl kustomize` (the kustomization is written into `scratch`).
fn kustomize_with_component(bins: &Path, scratch: &Path, component: &str) -> String {
    let up = format!("../..{ROOT}");
    std::fs::write(
        scratch.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - \
             {up}/deploy\ncomponents:\n  - {up}/deploy/{component}\n"
        ),
    )
    .unwrap();
    let mut command = Command::new(bins.join("kubectl"));
    command.arg("kustomize").arg(scratch);
    let out = run(command, None);
    assert!(
        out.status.success(),
        "kubectl kustomize: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// deploy/autoscaling/: the env makes the extender serve the webhook (with TLS files where the
/// certificate Secret is mounted) and keep the node labels; the container port, the Service and
/// the NetworkPolicy agree on the port; the MutatingWebhookConfiguration sends pod creations to
/// that Service at /mutate, with failurePolicy Ignore, never from kube-system or the extender's
/// own namespace. (The e2e scenario `autoscaling::shares_beyond_one_gpu_...` registers this
/// configuration with a real kube-apiserver, which calls the webhook over TLS.)
#[test]
#[ignore = "needs the Kubernetes binaries; make test runs it, or cargo test --test deploy_manifests -- --ignored"]
fn the_autoscaling_component_sends_pod_creations_to_the_webhook() {
    let bins = k8s_bins("the_autoscaling_component_sends_pod_creations_to_the_webhook");
    let scratch = scratch_dir("autoscaling");
    let text_out = kustomize_with_component(&bins, &scratch, "autoscaling");
    let rendered = Rendered {
        objects: parse_documents(&text_out, "deploy + autoscaling"),
        text: text_out,
    };
    let extender = rendered.container("gpu-extender");
    let env: Vec<(String, String)> = extender["env"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_owned(),
                e["value"].as_str()?.to_owned(),
            ))
        })
        .filter(|(name, _)| name.starts_with("GPU_EXTENDER_WEBHOOK_"))
        .collect();
    let config = effective_extender_config(&rendered.extender_config_text(), &scratch, &env);
    assert_eq!(
        config["webhook"]["labelNodes"],
        Value::Bool(true),
        "{config:?}"
    );
    let listen = config["webhook"]["listen"]
        .as_str()
        .unwrap_or_else(|| panic!("webhook.listen is not set by {env:?}: {config:?}"));
    let port: u64 = listen.rsplit_once(':').unwrap().1.parse().unwrap();
    let named = Value::String("webhook".into());
    assert_eq!(rendered.port_number(extender, &named), port);
    let cert = config["webhook"]["tls"]["certFile"].as_str().unwrap();
    let mounted = extender["volumeMounts"]
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|m| m["name"].as_str() == Some("webhook-tls"))
        .expect("the webhook certificate's volume is mounted");
    assert!(cert.starts_with(mounted["mountPath"].as_str().unwrap()));
    let service = find(&rendered.objects, "Service", "gpu-extender-webhook");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], named);
    assert!(selector_matches(
        &service["spec"]["selector"],
        &rendered.deployment()["spec"]["template"]["metadata"]["labels"]
    ));
    let policy = find(&rendered.objects, "NetworkPolicy", "gpu-scheduler-webhook");
    assert_eq!(policy["spec"]["ingress"][0]["ports"][0]["port"], named);
    let webhook = &find(
        &rendered.objects,
        "MutatingWebhookConfiguration",
        "gpu-extender",
    )["webhooks"][0];
    let target = &webhook["clientConfig"]["service"];
    assert_eq!(target["name"], service["metadata"]["name"]);
    assert_eq!(target["namespace"].as_str(), Some(namespace(service)));
    assert_eq!(target["port"], service["spec"]["ports"][0]["port"]);
    assert_eq!(target["path"].as_str(), Some("/mutate"));
    assert_eq!(webhook["failurePolicy"].as_str(), Some("Ignore"));
    let excluded = &webhook["namespaceSelector"]["matchExpressions"][0];
    assert_eq!(excluded["operator"].as_str(), Some("NotIn"));
    for kept_out in ["kube-system", namespace(rendered.deployment())] {
        assert!(
            excluded["values"]
                .as_sequence()
                .unwrap()
                .contains(&Value::String(kept_out.into())),
            "the webhook may be sent pods of {kept_out}"
        );
    }
    let _ = std::fs::remove_dir_all(scratch);
}

#[test]
#[ignore = "needs the Kubernetes binaries; make test runs it, or cargo test --test deploy_manifests -- --ignored"]
fn the_karmada_estimator_component_serves_where_its_services_point() {
    let bins = k8s_bins("the_karmada_estimator_component_serves_where_its_services_point");
    let scratch = scratch_dir("karmada-estimator");
    let text_out = kustomize_with_karmada_estimator(&bins, &scratch);
    let rendered = Rendered {
        objects: parse_documents(&text_out, "deploy + karmada-estimator"),
        text: text_out,
    };
    let extender = rendered.container("gpu-extender");
    let env: Vec<(String, String)> = extender["env"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_owned(),
                e["value"].as_str()?.to_owned(),
            ))
        })
        .filter(|(name, _)| name.starts_with("GPU_EXTENDER_ESTIMATOR_"))
        .collect();
    let config = effective_extender_config(&rendered.extender_config_text(), &scratch, &env);
    let listen = config["estimator"]["listen"]
        .as_str()
        .unwrap_or_else(|| panic!("estimator.listen is not set by {env:?}: {config:?}"));
    // Off loopback with client certificates required (check-config refuses it otherwise),
    // served from the keys of the Secret mounted where the files are named.
    let tls = &config["estimator"]["tls"];
    for (key, file) in [
        ("certFile", "tls.crt"),
        ("keyFile", "tls.key"),
        ("clientCaFile", "ca.crt"),
    ] {
        let path = tls[key]
            .as_str()
            .unwrap_or_else(|| panic!("estimator.tls.{key} is not set: {config:?}"));
        let (dir, name) = path.rsplit_once('/').unwrap();
        assert_eq!(name, file, "estimator.tls.{key}");
        let mount = extender["volumeMounts"]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|m| m["mountPath"].as_str() == Some(dir))
            .unwrap_or_else(|| panic!("estimator.tls.{key}: nothing mounted at {dir}"));
        let volume = rendered.pod_spec()["volumes"]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|v| v["name"] == mount["name"])
            .unwrap_or_else(|| panic!("no volume {:?}", mount["name"]));
        assert_eq!(
            volume["secret"]["secretName"].as_str(),
            Some("gpu-extender-estimator-tls"),
            "estimator.tls.{key}"
        );
    }
    assert_eq!(
        config["estimator"]["allowUnauthenticated"].as_bool(),
        Some(false)
    );
    let port: u64 = listen.rsplit_once(':').unwrap().1.parse().unwrap();
    let named = Value::String("estimator".into());
    assert_eq!(rendered.port_number(extender, &named), port);
    let service = find(&rendered.objects, "Service", "gpu-extender-estimator");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], named);
    assert!(selector_matches(
        &service["spec"]["selector"],
        &rendered.deployment()["spec"]["template"]["metadata"]["labels"]
    ));
    let policy = find(
        &rendered.objects,
        "NetworkPolicy",
        "gpu-scheduler-estimator",
    );
    assert_eq!(policy["spec"]["ingress"][0]["ports"][0]["port"], named);
    // The Karmada side: the name karmada-scheduler derives (<prefix>-<cluster>, the cluster
    // the extender serves), in its namespace, ExternalName (the only type its client accepts),
    // its port the scheduler's default and an integer target port.
    let cluster = config["estimator"]["cluster"].as_str().unwrap();
    let host = parse_documents(
        &kustomize(&bins, "deploy/karmada-estimator/karmada-host"),
        "deploy/karmada-estimator/karmada-host",
    );
    let pointer = find(
        &host,
        "Service",
        &format!("karmada-scheduler-estimator-{cluster}"),
    );
    assert_eq!(namespace(pointer), "karmada-system");
    assert_eq!(pointer["spec"]["type"].as_str(), Some("ExternalName"));
    assert_eq!(pointer["spec"]["ports"][0]["port"].as_u64(), Some(10352));
    assert_eq!(
        pointer["spec"]["ports"][0]["targetPort"].as_u64(),
        Some(port)
    );
    let _ = std::fs::remove_dir_all(scratch);
}

#[test]
#[ignore = "needs the Kubernetes binaries; make test runs it, or cargo test --test deploy_manifests -- --ignored"]
fn the_pieces_of_the_deployment_agree() {
    let bins = k8s_bins("the_pieces_of_the_deployment_agree");
    let rendered = Rendered::base(&bins);
    let scratch = scratch_dir("pieces");
    let extender = effective_extender_config(&rendered.extender_config_text(), &scratch, &[]);
    let _ = std::fs::remove_dir_all(&scratch);
    let scheduler = rendered.scheduler_config();
    let deployment = rendered.deployment();
    let replicas = deployment["spec"]["replicas"].as_u64().unwrap_or(1);

    // kube-scheduler: the version tested here, leader election when replicated, the profile.
    let image = rendered.container("kube-scheduler")["image"]
        .as_str()
        .unwrap();
    assert_eq!(
        image,
        format!("registry.k8s.io/kube-scheduler:{}", k8s_version()),
        "the Deployment should run the kube-scheduler these tests run"
    );
    assert_eq!(
        scheduler["apiVersion"].as_str(),
        Some("kubescheduler.config.k8s.io/v1")
    );
    assert!(
        replicas < 2 || scheduler["leaderElection"]["leaderElect"].as_bool() == Some(true),
        "{replicas} replicas need leader election, or they schedule the same pods twice"
    );
    let profiles: Vec<&str> = scheduler["profiles"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|p| p["schedulerName"].as_str())
        .collect();
    assert!(
        profiles.contains(&PROFILE),
        "profiles {profiles:?} lack {PROFILE}"
    );
    assert!(
        scheduler["clientConnection"]["kubeconfig"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "in a pod, kube-scheduler uses its service account (no kubeconfig)"
    );

    // The extender stanza points at the sidecar as it is configured.
    let extenders = scheduler["extenders"].as_sequence().expect("extenders");
    assert_eq!(extenders.len(), 1);
    let stanza = &extenders[0];
    let listen = extender["server"]["listen"].as_str().unwrap();
    let prefix = extender["server"]["urlPrefix"].as_str().unwrap();
    assert_eq!(
        stanza["urlPrefix"].as_str(),
        Some(format!("http://{listen}{prefix}").as_str()),
        "urlPrefix must be the extender's server.listen and server.urlPrefix"
    );
    assert!(
        listen.starts_with("127.0.0.1:") || listen.starts_with("[::1]:"),
        "the extender's scheduling port must stay on the pod's loopback, not {listen}"
    );
    for verb in ["filterVerb", "prioritizeVerb", "bindVerb", "preemptVerb"] {
        if let Some(v) = stanza[verb].as_str() {
            assert!(
                EXTENDER_VERBS.contains(&v),
                "{verb}: {v} is not a route the extender serves"
            );
        }
    }
    if stanza["prioritizeVerb"].is_string() {
        assert!(
            stanza["weight"].as_i64().unwrap_or(0) > 0,
            "prioritize needs a positive weight"
        );
    }
    assert_eq!(stanza["nodeCacheCapable"].as_bool(), Some(true));
    let timeout = stanza["httpTimeout"].as_str().expect("httpTimeout");
    let timeout_ms: u64 = timeout
        .strip_suffix('s')
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap()
        * 1000;
    let request_ms = extender["server"]["requestTimeoutMs"].as_u64().unwrap();
    assert!(
        request_ms < timeout_ms,
        "the extender's requestTimeoutMs ({request_ms}) must be below httpTimeout ({timeout})"
    );
    // The recommended setup (decision 0006): a scheduler of its own that sends the extender
    // every pod (no managedResources), filter passing the policy's one choice.
    assert!(
        stanza.get("managedResources").is_none(),
        "the dedicated gpu-scheduler sends the extender every pod: no managedResources"
    );
    assert_eq!(
        extender["policy"]["filterBestOnly"].as_bool(),
        Some(true),
        "the extender passes the policy's one choice (policy.filterBestOnly)"
    );
    assert_eq!(
        profiles,
        [PROFILE],
        "a scheduler that sends the extender every pod must serve no other profile"
    );
    let read = |file: &str| -> Value {
        serde_yaml_ng::from_str(&std::fs::read_to_string(Path::new(ROOT).join(file)).unwrap())
            .unwrap()
    };
    let dedicated = read("scheduler-config/gpu-scheduler-dedicated.yaml");
    assert_eq!(
        &dedicated["extenders"], &scheduler["extenders"],
        "the extender stanza differs between deploy/ and scheduler-config/gpu-scheduler-dedicated.yaml"
    );
    assert_eq!(
        dedicated["profiles"], scheduler["profiles"],
        "the profile differs between deploy/ and scheduler-config/gpu-scheduler-dedicated.yaml"
    );
    assert_eq!(
        dedicated["percentageOfNodesToScore"], scheduler["percentageOfNodesToScore"],
        "the window (percentageOfNodesToScore) differs between deploy/ and \
         scheduler-config/gpu-scheduler-dedicated.yaml"
    );

    // The configurations that share a kube-scheduler with the default profile call the extender
    // only for pods that ask for its resources: managedResources are the extender's names.
    let mut resources: Vec<&str> = ["wholeGpu", "gpuMem", "gpuCore", "topologyGpu"]
        .iter()
        .map(|k| extender["resources"][*k].as_str().unwrap())
        .collect();
    resources.sort();
    let shared: Vec<Value> = [
        "scheduler-config/gpu-scheduler-profile.yaml",
        "scheduler-config/default-scheduler-extended.yaml",
    ]
    .map(read)
    .to_vec();
    // Besides them, the MIG profiles' resources (docs/mig.md): each a profile the extender
    // reads, still counted by kube-scheduler.
    for config in &shared {
        let entries: Vec<&Value> = config["extenders"][0]["managedResources"]
            .as_sequence()
            .into_iter()
            .flatten()
            .collect();
        let (mig, others): (Vec<&Value>, Vec<&Value>) = entries.into_iter().partition(|r| {
            r["name"].as_str().is_some_and(|name| {
                name.starts_with(gpu_extender::objects::translate::MIG_RESOURCE_PREFIX)
            })
        });
        let mut managed: Vec<&str> = others.iter().filter_map(|r| r["name"].as_str()).collect();
        managed.sort();
        assert_eq!(
            managed, resources,
            "managedResources must be the extender's resource names and MIG profiles"
        );
        assert!(!mig.is_empty(), "the MIG profiles are managed");
        for entry in mig {
            let name = entry["name"].as_str().unwrap_or_default();
            assert!(
                matches!(
                    gpu_extender::objects::translate::mig_profile_of(name),
                    Some(Ok(_))
                ),
                "{name} is not a MIG profile the extender reads"
            );
            assert_eq!(
                entry["ignoredByScheduler"].as_bool(),
                Some(false),
                "{name}: kube-scheduler keeps counting MIG slices"
            );
        }
    }
    assert_eq!(
        shared[0]["extenders"], shared[1]["extenders"],
        "the two shared configurations carry different extender stanzas"
    );

    // The extender sidecar: the binary's serve subcommand, probes on the admin port.
    let sidecar = rendered.container("gpu-extender");
    let args: Vec<&str> = sidecar["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        args.first(),
        Some(&"serve"),
        "the image's binary runs `gpu-extender serve`"
    );
    let image = sidecar["image"].as_str().unwrap();
    // [registry/]gpu-extender:<tag> or @<digest>, as `kustomize edit set image` leaves it.
    let repository_and_tag = image.rsplit('/').next().unwrap_or_default();
    assert!(
        repository_and_tag.starts_with("gpu-extender:")
            || repository_and_tag.starts_with("gpu-extender@"),
        "the extender image should be [registry/]gpu-extender:<tag>, not {image}"
    );
    let admin_port: u64 = extender["server"]["adminListen"]
        .as_str()
        .and_then(|a| a.rsplit_once(':'))
        .and_then(|(_, p)| p.parse().ok())
        .expect("server.adminListen host:port");
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &sidecar[probe]["httpGet"];
        assert_eq!(get["path"].as_str(), Some(path), "gpu-extender {probe}");
        assert_eq!(
            rendered.port_number(sidecar, &get["port"]),
            admin_port,
            "gpu-extender {probe} must target server.adminListen"
        );
    }

    // The metrics Service and the ServiceMonitor reach the admin port of these pods.
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let service = rendered
        .objects
        .iter()
        .find(|o| kind(o) == "Service")
        .expect("a metrics Service");
    assert!(
        selector_matches(&service["spec"]["selector"], pod_labels),
        "Service selects no pod"
    );
    let service_port = &service["spec"]["ports"][0];
    assert_eq!(
        rendered.port_number(sidecar, &service_port["targetPort"]),
        admin_port
    );
    let monitoring = parse_documents(&kustomize(&bins, "deploy/monitoring"), "deploy/monitoring");
    let monitor = monitoring
        .iter()
        .find(|o| kind(o) == "ServiceMonitor")
        .expect("a ServiceMonitor");
    assert_eq!(namespace(monitor), namespace(service));
    assert!(
        selector_matches(
            &monitor["spec"]["selector"]["matchLabels"],
            &service["metadata"]["labels"]
        ),
        "the ServiceMonitor selects no Service"
    );
    assert_eq!(
        monitor["spec"]["endpoints"][0]["port"],
        service_port["name"]
    );

    // The PodDisruptionBudget keeps one replica.
    let pdb = rendered
        .objects
        .iter()
        .find(|o| kind(o) == "PodDisruptionBudget")
        .expect("a PDB");
    assert!(selector_matches(
        &pdb["spec"]["selector"]["matchLabels"],
        pod_labels
    ));
    assert!(replicas >= 2, "one replica has no standby");
    assert!(
        pdb["spec"]["minAvailable"]
            .as_u64()
            .is_some_and(|m| m >= 1 && m < replicas)
    );

    // Every namespaced object is in the namespace deploy/ creates, but the one RoleBinding
    // kube-scheduler needs in kube-system.
    let ns = name(
        rendered
            .objects
            .iter()
            .find(|o| kind(o) == "Namespace")
            .unwrap(),
    );
    for object in &rendered.objects {
        let cluster_scoped = matches!(
            kind(object),
            "Namespace"
                | "ClusterRole"
                | "ClusterRoleBinding"
                | "ValidatingAdmissionPolicy"
                | "ValidatingAdmissionPolicyBinding"
        );
        let expected = if cluster_scoped {
            ""
        } else if kind(object) == "RoleBinding" && namespace(object) == "kube-system" {
            "kube-system"
        } else {
            ns
        };
        assert_eq!(namespace(object), expected, "{}", describe(object));
    }
}

#[test]
#[ignore = "needs the Kubernetes binaries; make test runs it, or cargo test --test deploy_manifests -- --ignored"]
fn the_pod_is_locked_down() {
    let bins = k8s_bins("the_pod_is_locked_down");
    let rendered = Rendered::base(&bins);
    let pod = rendered.pod_spec();
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    assert!(
        pod["securityContext"]["runAsUser"]
            .as_u64()
            .is_some_and(|u| u > 0)
    );
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"].as_str(),
        Some("RuntimeDefault")
    );
    assert_ne!(pod["hostNetwork"].as_bool(), Some(true));
    let containers = rendered.containers();
    assert_eq!(
        containers.len(),
        2,
        "kube-scheduler and the gpu-extender sidecar"
    );
    for c in containers {
        let who = c["name"].as_str().unwrap();
        let sc = &c["securityContext"];
        assert_eq!(
            sc["allowPrivilegeEscalation"].as_bool(),
            Some(false),
            "{who}"
        );
        assert_eq!(sc["readOnlyRootFilesystem"].as_bool(), Some(true), "{who}");
        assert_ne!(sc["privileged"].as_bool(), Some(true), "{who}");
        assert_eq!(
            sc["capabilities"]["drop"],
            serde_yaml_ng::from_str::<Value>("[ALL]").unwrap(),
            "{who}"
        );
        assert!(sc["capabilities"]["add"].is_null(), "{who}");
        for bound in ["requests", "limits"] {
            for resource in ["cpu", "memory"] {
                assert!(
                    !c["resources"][bound][resource].is_null(),
                    "{who}: resources.{bound}.{resource} is not set"
                );
            }
        }
        for probe in ["livenessProbe", "readinessProbe"] {
            assert!(c[probe].is_mapping(), "{who} has no {probe}");
        }
    }
}

/// kubectl applies objects in the order `kubectl kustomize` prints them: the admission policies
/// come before the RBAC they narrow and the workloads that use it, in deploy/ and in
/// deploy/node-agent/.
#[test]
#[ignore = "needs the Kubernetes binaries; make test runs it, or cargo test --test deploy_manifests -- --ignored"]
fn admission_policies_are_applied_before_the_rights_they_narrow() {
    let bins = k8s_bins("admission_policies_are_applied_before_the_rights_they_narrow");
    for dir in ["deploy", "deploy/node-agent"] {
        let objects = parse_documents(&kustomize(&bins, dir), dir);
        let position = |kinds: &[&str]| -> Vec<usize> {
            objects
                .iter()
                .enumerate()
                .filter(|(_, o)| kinds.contains(&kind(o)))
                .map(|(i, _)| i)
                .collect()
        };
        let policies = position(&[
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ]);
        let narrowed = position(&[
            "ServiceAccount",
            "Role",
            "ClusterRole",
            "RoleBinding",
            "ClusterRoleBinding",
            "Deployment",
            "DaemonSet",
        ]);
        assert!(!policies.is_empty() && !narrowed.is_empty(), "{dir}");
        let order: Vec<String> = objects.iter().map(describe).collect();
        assert!(
            policies.iter().max() < narrowed.iter().min(),
            "{dir}: an admission policy comes after what it narrows:\n{}",
            order.join("\n")
        );
    }
}

/// Every ingress rule of the NetworkPolicies in deploy/ names its sources (a rule without `from`
/// admits every source), and the gpu-scheduler pods admit nothing on the extender's scheduling
/// port, which kube-scheduler reaches over the pod's loopback. Read from the files themselves.
#[test]
fn network_policies_admit_named_sources_only() {
    let mut policies = Vec::new();
    for file in [
        "deploy/networkpolicy.yaml",
        "deploy/karmada-estimator/networkpolicy.yaml",
    ] {
        let text = std::fs::read_to_string(Path::new(ROOT).join(file)).unwrap();
        policies.extend(parse_documents(&text, file));
    }
    assert_eq!(policies.len(), 2);
    for policy in &policies {
        let who = describe(policy);
        let rules = policy["spec"]["ingress"].as_sequence().unwrap();
        assert!(!rules.is_empty(), "{who}");
        for rule in rules {
            let from = rule["from"].as_sequence();
            assert!(
                from.is_some_and(|peers| !peers.is_empty()
                    && peers
                        .iter()
                        .all(|p| p.as_mapping().is_some_and(|m| !m.is_empty()))),
                "{who}: a rule that admits every source: {rule:?}"
            );
        }
    }
    let scheduler = find(&policies, "NetworkPolicy", "gpu-scheduler");
    let ports: Vec<&str> = scheduler["spec"]["ingress"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|r| r["ports"].as_sequence().unwrap())
        .map(|p| p["port"].as_str().unwrap())
        .collect();
    assert_eq!(ports, ["admin", "https"]);
}

/// The sidecar's command line is one the binary accepts (`gpu-extender serve --config=...`).
/// Read from `deploy/deployment.yaml` itself, so this needs no Kubernetes binaries.
#[test]
fn the_extender_binary_accepts_the_sidecar_command_line() {
    let objects = support::manifests::kustomization_resources(&Path::new(ROOT).join("deploy"));
    let deployment = find(&objects, "Deployment", "gpu-scheduler");
    let sidecar = ["initContainers", "containers"]
        .iter()
        .flat_map(|k| {
            deployment["spec"]["template"]["spec"][*k]
                .as_sequence()
                .into_iter()
                .flatten()
        })
        .find(|c| c["name"].as_str() == Some("gpu-extender"))
        .expect("a gpu-extender container");
    assert!(
        sidecar["command"].is_null(),
        "the image's entrypoint is the binary; set args only"
    );
    let args: Vec<&str> = sidecar["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string args"))
        .collect();
    // clap parses everything before acting on --help, so an unknown subcommand or flag fails.
    let mut command = Command::new(EXTENDER_BIN);
    command.args(&args).arg("--help");
    let out = run(command, None);
    assert!(
        out.status.success(),
        "`gpu-extender {}` is not a command line the binary accepts:\n{}",
        args.join(" "),
        text(&out.stderr)
    );
}

/// docs/install.md tells gpushare users to replace their scheduler configuration rather than
/// carry it over: the kube-scheduler deploy/ runs refuses it.
#[test]
#[ignore = "needs the Kubernetes binaries; make test runs it, or cargo test --test deploy_manifests -- --ignored"]
fn gpushare_v1beta2_configuration_is_refused_by_this_kube_scheduler() {
    let bins = k8s_bins("gpushare_v1beta2_configuration_is_refused_by_this_kube_scheduler");
    // gpushare-scheduler-extender's config/scheduler-policy-config.yaml, in substance.
    let gpushare = "\
apiVersion: kubescheduler.config.k8s.io/v1beta2
kind: KubeSchedulerConfiguration
clientConnection: {kubeconfig: /etc/kubernetes/scheduler.conf}
extenders:
- urlPrefix: http://127.0.0.1:32766/gpushare-scheduler
  filterVerb: filter
  bindVerb: bind
  nodeCacheCapable: true
  managedResources: [{name: aliyun.com/gpu-mem, ignoredByScheduler: false}]
  ignorable: false
";
    let scratch = scratch_dir("gpushare");
    let file = scratch.join("gpushare.yaml");
    std::fs::write(&file, gpushare).unwrap();
    let mut command = Command::new(bins.join("kube-scheduler"));
    command
        .arg(format!("--config={}", file.display()))
        .arg("--bind-address=127.0.0.1")
        .arg("--secure-port=0");
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("kube-scheduler kept running with a v1beta2 configuration");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    let _ = std::fs::remove_dir_all(scratch);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(
            r#"no kind \"KubeSchedulerConfiguration\" is registered for version \"kubescheduler.config.k8s.io/v1beta2\""#
        ),
        "unexpected refusal:\n{stderr}"
    );
}

// ---------------------------------------------------------------------------------------------
// Against a real API server and kube-scheduler

/// A control plane from the workspace's one driver (`gpu_test_support::plane`), stopped on
/// drop. Its directory is removed when the test passed and kept (and named) when it failed.
struct Plane {
    plane: ControlPlane,
    dir: PathBuf,
    bins: PathBuf,
}

impl Plane {
    fn start(bins: &Path) -> Self {
        let dir = std::env::temp_dir().join(format!("gpu-extender-plane-{}", std::process::id()));
        match ControlPlane::start(Path::new(ROOT), bins, dir.clone(), &[], false) {
            Ok(plane) => Plane {
                plane,
                dir,
                bins: bins.to_owned(),
            },
            Err(error) => panic!("control plane did not start: {error:#}"),
        }
    }

    fn script(&self, args: &[&str]) -> Command {
        self.plane.command(args, &[])
    }

    /// kubectl as the plane's admin.
    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut command = Command::new(self.bins.join("kubectl"));
        command
            .args(args)
            .env("KUBECONFIG", self.dir.join("kubeconfig"));
        run(command, stdin)
    }

    fn kubectl_ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.kubectl(args, stdin);
        assert!(
            out.status.success(),
            "kubectl {} failed:\n{}{}",
            args.join(" "),
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    /// Installs the Prometheus Operator's ServiceMonitor CRD from the file `crd`
    /// (`$GPU_TEST_SERVICEMONITOR_CRD`) and waits until it serves.
    fn install_service_monitor_crd(&self, crd: &str) {
        self.kubectl_ok(&["apply", "--server-side", "-f", crd], None);
        self.kubectl_ok(
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd/servicemonitors.monitoring.coreos.com",
            ],
            None,
        );
    }

    /// Creates, for real, the object of kind `wanted` among `objects`: a Namespace before a dry
    /// run of what goes into it (a dry run only pretends to create it, and its objects are then
    /// refused), a CRD before the objects of its kind.
    fn apply_one(&self, objects: &[Value], wanted: &str) {
        let doc = objects
            .iter()
            .find(|o| kind(o) == wanted)
            .map(|o| serde_yaml_ng::to_string(o).unwrap())
            .unwrap_or_else(|| panic!("no {wanted} to apply"));
        self.kubectl_ok(&["apply", "-f", "-"], Some(&doc));
    }

    /// A server-side dry run of `manifests` (`what`, for messages): all of its `count` objects
    /// accepted, without warnings (which include the namespace's Pod Security level, checked on
    /// pod templates).
    fn dry_run_accepts(&self, manifests: &str, count: usize, what: &str) {
        let out = self.kubectl(&["apply", "--dry-run=server", "-f", "-"], Some(manifests));
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(
            out.status.success(),
            "server-side dry run refused {what}:\n{stdout}{stderr}"
        );
        assert!(
            !stderr.contains("Warning"),
            "the API server warned about {what}:\n{stderr}"
        );
        assert_eq!(
            stdout
                .lines()
                .filter(|l| l.contains("(server dry run)"))
                .count(),
            count,
            "every object of {what} should be accepted:\n{stdout}"
        );
    }

    fn scheduler_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("kube-scheduler.log")).unwrap_or_default()
    }

    /// `gpu-extender serve` with `config_text`, as the probe ServiceAccount of `namespace`
    /// (a token from the API server in a kubeconfig of its own).
    fn start_extender(&self, config_text: &str, namespace: &str, extra: &[String]) -> Extender {
        let token = self.kubectl_ok(
            &[
                "-n",
                namespace,
                "create",
                "token",
                PROBE_ACCOUNT,
                "--duration=1h",
            ],
            None,
        );
        let kubeconfig_file = self.kubeconfig_with_token("extender.kubeconfig", &token);
        let config_file = self.dir.join("extender-config.yaml");
        std::fs::write(&config_file, config_text).unwrap();
        let log = self.dir.join("extender.log");
        let log_file = std::fs::File::create(&log).unwrap();
        let mut command = Command::new(EXTENDER_BIN);
        command
            .arg("serve")
            .arg(format!("--config={}", config_file.display()))
            .arg(format!("--kubeconfig={}", kubeconfig_file.display()))
            // In a pod the writer Lease's namespace is read from the service account's files;
            // here the process runs outside one, as that account.
            .arg(format!("--set=writerLease.namespace={namespace}"))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("GPU_EXTENDER_") {
                command.env_remove(key);
            }
        }
        let child = command.spawn().unwrap();
        Extender { child, log }
    }

    /// The end of kube-scheduler's log, for failure messages.
    fn scheduler_log_tail(&self) -> String {
        let log = self.scheduler_log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

/// The probe ServiceAccount bound to the extender's ClusterRole only.
const PROBE_ACCOUNT: &str = "gpu-extender-rbac-probe";

/// A node with 8 whole GPUs (no kubelet: its status is written through the status subresource).
const GPU_NODE: &str = "\
apiVersion: v1
kind: Node
metadata:
  name: gpu-node-1
  labels: {kubernetes.io/hostname: gpu-node-1}
";
const GPU_NODE_STATUS: &str = r#"{"status": {
  "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "8"},
  "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "8"},
  "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}"#;
const GPU_POD: &str = "\
apiVersion: v1
kind: Pod
metadata: {name: gpu-probe, namespace: default}
spec:
  schedulerName: gpu-scheduler
  containers:
    - name: c
      image: registry.invalid/none:1
      resources: {limits: {nvidia.com/gpu: 1}}
";

/// The HTTP status code of a GET (empty when nothing answers).
fn http_status(url: &str) -> String {
    let mut command = Command::new("curl");
    command.args([
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--max-time",
        "5",
        url,
    ]);
    text(&run(command, None).stdout)
}

/// The extender process, killed on drop.
struct Extender {
    child: std::process::Child,
    log: PathBuf,
}

impl Extender {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Extender {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn curl_status(url: &str) -> (bool, String) {
    let mut command = Command::new("curl");
    command.args(["-sk", "--max-time", "5", url]);
    let out = run(command, None);
    (out.status.success(), text(&out.stdout))
}

#[test]
#[ignore = "needs the Kubernetes binaries; make test runs it, or cargo test --test deploy_manifests -- --ignored"]
fn deploy_applies_to_a_real_api_server_and_its_scheduler_config_runs() {
    let test = "deploy_applies_to_a_real_api_server_and_its_scheduler_config_runs";
    let bins = k8s_bins(test);
    let _serial = serial();
    let rendered = Rendered::base(&bins);
    let plane = Plane::start(&bins);

    // 1. Server-side dry run of the whole base. Namespaced objects of a namespace that a dry run
    //    only pretends to create are refused, so the Namespace is created for real first.
    plane.apply_one(&rendered.objects, "Namespace");
    plane.dry_run_accepts(&rendered.text, rendered.objects.len(), "deploy/");

    // 2. The ServiceMonitor: against its CRD when one is given, otherwise parsed only.
    let monitoring = kustomize(&bins, "deploy/monitoring");
    let client_dry_run =
        plane.kubectl(&["apply", "--dry-run=client", "-f", "-"], Some(&monitoring));
    if client_dry_run.status.success() {
        plane.kubectl_ok(&["apply", "--dry-run=server", "-f", "-"], Some(&monitoring));
    } else if let Some(crd) = std::env::var_os(CRD_ENV) {
        let crd = crd.to_string_lossy().into_owned();
        plane.install_service_monitor_crd(&crd);
        let out = plane.kubectl(&["apply", "--dry-run=server", "-f", "-"], Some(&monitoring));
        assert!(
            out.status.success() && !text(&out.stderr).contains("Warning"),
            "the ServiceMonitor against the CRD from {crd}:\n{}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    } else {
        let why = text(&client_dry_run.stderr);
        assert!(
            why.contains("no matches for kind \"ServiceMonitor\""),
            "kubectl: {why}"
        );
        // Without the CRD, kubectl can still decode it as a Kubernetes object, locally.
        let parsed = plane.kubectl_ok(
            &["label", "--local", "-f", "-", "-o", "yaml", "parsed=yes"],
            Some(&monitoring),
        );
        assert!(parsed.contains("kind: ServiceMonitor"));
        eprintln!(
            "{test}: the ServiceMonitor CRD is not installed; deploy/monitoring was parsed, not \
             validated (set {CRD_ENV} to the CRD file to validate it)"
        );
    }

    // 3. For real, so the RBAC exists for the checks below.
    plane.kubectl_ok(&["apply", "-f", "-"], Some(&rendered.text));

    // 4. The extender's ClusterRole alone allows every call the code makes, as the API server
    //    itself evaluates it. The pod's service account also holds kube-scheduler's rights, so
    //    a probe service account is bound to the extender's ClusterRole(s) only.
    let extender_roles: Vec<&Value> = rendered
        .objects
        .iter()
        .filter(|o| {
            kind(o) == "ClusterRole" && label(o, "app.kubernetes.io/component") == Some("extender")
        })
        .collect();
    assert!(!extender_roles.is_empty(), "no extender ClusterRole");
    let ns = namespace(rendered.deployment());
    plane.kubectl_ok(&["-n", ns, "create", "serviceaccount", PROBE_ACCOUNT], None);
    let probe_user = format!("system:serviceaccount:{ns}:{PROBE_ACCOUNT}");
    for role in &extender_roles {
        let binding = format!("{PROBE_ACCOUNT}-{}", name(role));
        plane.kubectl_ok(
            &[
                "create",
                "clusterrolebinding",
                &binding,
                &format!("--clusterrole={}", name(role)),
                &format!("--serviceaccount={ns}:{PROBE_ACCOUNT}"),
            ],
            None,
        );
    }
    // The writer Lease's namespaced Role (src/k8s/lease.rs), bound to the probe the same way.
    for role in rendered.objects.iter().filter(|o| {
        kind(o) == "Role" && label(o, "app.kubernetes.io/component") == Some("extender")
    }) {
        plane.kubectl_ok(
            &[
                "-n",
                namespace(role),
                "create",
                "rolebinding",
                &format!("{PROBE_ACCOUNT}-{}", name(role)),
                &format!("--role={}", name(role)),
                &format!("--serviceaccount={ns}:{PROBE_ACCOUNT}"),
            ],
            None,
        );
    }
    // The optional ElasticQuota CRD (deploy/quota/), installed for real: the API server must
    // accept it, and `auth can-i` only answers for resource types it serves.
    let quota = kustomize(&bins, "deploy/quota");
    plane.kubectl_ok(&["apply", "-f", "-"], Some(&quota));
    plane.kubectl_ok(
        &[
            "wait",
            "--for=condition=Established",
            "crd/elasticquotas.scheduling.x-k8s.io",
            "--timeout=60s",
        ],
        None,
    );
    let scan = api_calls::scan_dir(&Path::new(ROOT).join("src"));
    assert!(
        scan.problems.is_empty(),
        "see tests/rbac.rs: {:?}",
        scan.problems
    );
    let mut denied = Vec::new();
    for permission in scan.permissions() {
        let resource = permission.kubectl_resource();
        let mut args = vec!["auth", "can-i", permission.verb.as_str(), resource.as_str()];
        let sub;
        if let (_, Some(s)) = permission.split_subresource() {
            sub = format!("--subresource={s}");
            args.push(&sub);
        }
        let who = format!("--as={probe_user}");
        // The writer Lease is one named object in the extender's namespace.
        let lease;
        if permission.resource == "leases" {
            if permission.verb != "create" {
                lease = "leases/gpu-extender-writer".to_owned();
                args[3] = lease.as_str();
            }
            args.extend(["-n", ns, &who]);
        } else {
            args.extend(["--all-namespaces", &who]);
        }
        let out = plane.kubectl(&args, None);
        if text(&out.stdout).trim() != "yes" {
            denied.push(format!(
                "{permission}: {}{}",
                text(&out.stdout).trim(),
                text(&out.stderr).trim()
            ));
        }
    }
    assert!(
        denied.is_empty(),
        "the extender's ClusterRole (and its writer Lease's Role) do not allow:\n  {}",
        denied.join("\n  ")
    );

    // 5. The extender itself, with the ConfigMap's configuration and only that identity: its
    //    watches must sync (it reports ready). Ports are moved to free ones; the rest is as
    //    shipped.
    let extender_port = free_port().unwrap();
    let admin_port = free_port().unwrap();
    let extender = plane.start_extender(
        &rendered.extender_config_text(),
        ns,
        &[
            format!("--listen=127.0.0.1:{extender_port}"),
            format!("--admin-listen=127.0.0.1:{admin_port}"),
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_status(&format!("http://127.0.0.1:{admin_port}/readyz")) != "200" {
        assert!(
            Instant::now() < deadline,
            "the extender is not ready after 60s with the extender ClusterRole alone:\n{}",
            extender.log_tail()
        );
        std::thread::sleep(Duration::from_millis(250));
    }

    // 6. kube-scheduler with the shipped KubeSchedulerConfiguration, as the plane's
    //    system:kube-scheduler user (its kubeconfig replaces __KUBECONFIG__), calling that
    //    extender.
    let mut config = rendered.scheduler_config();
    let shipped_url = config["extenders"][0]["urlPrefix"]
        .as_str()
        .unwrap()
        .to_owned();
    let (_, path) = shipped_url
        .trim_start_matches("http://")
        .split_once('/')
        .unwrap();
    config["extenders"][0].as_mapping_mut().unwrap().insert(
        "urlPrefix".into(),
        format!("http://127.0.0.1:{extender_port}/{path}").into(),
    );
    let mut connection = serde_yaml_ng::Mapping::new();
    connection.insert("kubeconfig".into(), "__KUBECONFIG__".into());
    config
        .as_mapping_mut()
        .unwrap()
        .insert("clientConnection".into(), Value::Mapping(connection));
    let config_file = plane.dir.join("gpu-scheduler-config.yaml");
    std::fs::write(&config_file, serde_yaml_ng::to_string(&config).unwrap()).unwrap();
    let out = run(
        plane.script(&["scheduler", config_file.to_str().unwrap()]),
        None,
    );
    assert!(
        out.status.success(),
        "kube-scheduler did not come up healthy with deploy/'s configuration:\n{}\n{}",
        text(&out.stderr),
        plane.scheduler_log_tail()
    );
    let port = std::fs::read_to_string(plane.dir.join("kube-scheduler.port")).unwrap();
    let base = format!("https://127.0.0.1:{}", port.trim());
    for path in ["/healthz", "/livez"] {
        let (ok, body) = curl_status(&format!("{base}{path}"));
        assert!(ok && body == "ok", "kube-scheduler {path}: {body}");
    }
    // That user may not touch this scheduler's Lease yet: it is a standby, and becomes ready
    // as one once its informers have synced (the PodDisruptionBudget counts ready pods, so a
    // standby must be able to be ready).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, readyz) = curl_status(&format!("{base}/readyz?verbose"));
        if readyz.contains("readyz check passed") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the standby kube-scheduler is not ready after 30s:\n{readyz}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let log = plane.scheduler_log();
    assert!(
        !log.contains("successfully acquired lease"),
        "kube-scheduler led before it was allowed its Lease"
    );

    // 7. With the leader-election Role of deploy/ bound to it, it takes the Lease.
    let election = &config["leaderElection"];
    let lease = election["resourceName"].as_str().unwrap();
    let lease_ns = election["resourceNamespace"].as_str().unwrap();
    let role = rendered
        .objects
        .iter()
        .find(|o| {
            kind(o) == "Role"
                && namespace(o) == lease_ns
                && label(o, "app.kubernetes.io/component") == Some("kube-scheduler")
        })
        .expect("a Role for kube-scheduler's Lease");
    plane.kubectl_ok(
        &[
            "-n",
            lease_ns,
            "create",
            "rolebinding",
            "rbac-probe-lease",
            &format!("--role={}", name(role)),
            "--user=system:kube-scheduler",
        ],
        None,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let holder = loop {
        let out = plane.kubectl(
            &[
                "-n",
                lease_ns,
                "get",
                "lease",
                lease,
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ],
            None,
        );
        let holder = text(&out.stdout);
        if out.status.success() && !holder.is_empty() {
            break holder;
        }
        assert!(
            Instant::now() < deadline,
            "kube-scheduler did not take the Lease {lease_ns}/{lease} in 60s:\n{}",
            plane.scheduler_log_tail()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let log = plane.scheduler_log();
    assert!(
        log.contains(&format!("successfully acquired lease {lease_ns}/{lease}")),
        "Lease held by {holder}, but the log does not say so:\n{log}"
    );
    let forbidden: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("forbidden") && !l.contains(&format!("\"{lease}\" is forbidden")))
        .collect();
    assert!(
        forbidden.is_empty(),
        "kube-scheduler was refused something:\n{}",
        forbidden.join("\n")
    );

    // 8. A GPU pod selecting the profile is bound, by the extender, with its allocation record.
    plane.kubectl_ok(&["create", "-f", "-"], Some(GPU_NODE));
    plane.kubectl_ok(
        &[
            "patch",
            "node",
            "gpu-node-1",
            "--subresource=status",
            "--type=merge",
            "-p",
            GPU_NODE_STATUS,
        ],
        None,
    );
    plane.kubectl_ok(&["create", "-f", "-"], Some(GPU_POD));
    let record_key =
        effective_extender_config(&rendered.extender_config_text(), &plane.dir, &[])["annotations"]
            ["allocation"]
            .as_str()
            .unwrap()
            .replace('.', "\\.");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = plane.kubectl(
            &[
                "get",
                "pod",
                "gpu-probe",
                "-o",
                &format!("jsonpath={{.spec.nodeName}} {{.metadata.annotations.{record_key}}}"),
            ],
            None,
        );
        let got = text(&out.stdout);
        if got.starts_with("gpu-node-1 {") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the GPU pod was not bound with its record in 60s ({got:?}).\nextender:\n{}\n\
             kube-scheduler:\n{}",
            extender.log_tail(),
            plane.scheduler_log_tail()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let extender_log = extender.log();
    assert!(
        !extender_log.contains("forbidden") && !extender_log.contains(" 403"),
        "the extender was refused something:\n{extender_log}"
    );

    // 9. The pod's ServiceAccount, shared by kube-scheduler and the extender, with every right
    //    deploy/ binds to it: pod-write-policy.yaml lets it set the requeue annotation on that
    //    pod and refuses any other change.
    let (_, account) = rendered.service_account();
    pod_writes_are_held_to_the_requeue_annotation(&plane, ns, &account);
}

/// A key that names the requeue annotation (`annotations.requeue`'s default).
const REQUEUE: &str = "gpu-extender.io/requeue";

/// As `system:serviceaccount:<ns>:<account>` (the Deployment's ServiceAccount, holding what
/// deploy/ binds to it), on the bound pod `gpu-probe`: setting the requeue annotation is allowed;
/// an image, a label, another annotation, the allocation record and the requeue annotation's
/// removal are refused by pod-write-policy.yaml; kube-scheduler's own writes (status,
/// deletion) stay allowed. Another account with `patch` on pods is not held to it.
fn pod_writes_are_held_to_the_requeue_annotation(plane: &Plane, ns: &str, account: &str) {
    let user = format!("system:serviceaccount:{ns}:{account}");
    let as_account = |user: &str, args: &[&str]| {
        let groups = format!("--as-group=system:serviceaccounts:{ns}");
        let mut all = vec![
            "--as",
            user,
            "--as-group=system:serviceaccounts",
            &groups,
            "--as-group=system:authenticated",
            "-n",
            "default",
        ];
        all.extend_from_slice(args);
        let out = plane.kubectl(&all, None);
        (
            out.status.success(),
            format!("{}{}", text(&out.stdout), text(&out.stderr)),
        )
    };
    let said = "may update a pod only to set its annotation gpu-extender.io/requeue";
    // Applied in step 3; a policy takes effect once the API server has compiled it.
    eventually("the pod-write policy takes effect", || {
        let (ok, out) = as_account(
            &user,
            &["label", "--dry-run=server", "pod", "gpu-probe", "probe=yes"],
        );
        !ok && out.contains(said)
    });
    let (ok, out) = as_account(
        &user,
        &[
            "annotate",
            "--overwrite",
            "pod",
            "gpu-probe",
            &format!("{REQUEUE}=2026-01-01T00:00:00Z"),
        ],
    );
    assert!(ok, "the requeue annotation was refused: {out}");
    let stamp = plane.kubectl_ok(
        &[
            "get",
            "pod",
            "gpu-probe",
            "-o",
            &format!(
                "jsonpath={{.metadata.annotations.{}}}",
                REQUEUE.replace('.', "\\.")
            ),
        ],
        None,
    );
    assert_eq!(stamp, "2026-01-01T00:00:00Z");
    let record = format!("{}={{}}", "gpu-extender.io/allocation");
    let requeue_removed = format!("{REQUEUE}-");
    let refused: [(&str, &[&str]); 5] = [
        (
            "a new image",
            &[
                "set",
                "image",
                "pod/gpu-probe",
                "c=registry.invalid/other:2",
            ],
        ),
        ("a label", &["label", "pod", "gpu-probe", "stolen=yes"]),
        (
            "another annotation",
            &["annotate", "pod", "gpu-probe", "team.example.com/owner=ml"],
        ),
        (
            "the allocation record",
            &["annotate", "--overwrite", "pod", "gpu-probe", &record],
        ),
        (
            "the requeue annotation removed",
            &["annotate", "pod", "gpu-probe", &requeue_removed],
        ),
    ];
    for (what, args) in refused {
        let (ok, out) = as_account(&user, args);
        // The record is also the record policy's; either refusal names its policy.
        assert!(
            !ok && (out.contains(said)
                || (what == "the allocation record" && out.contains("denied request"))),
            "{what} as {user}: not refused by the policy:\n{out}"
        );
    }
    // No pod update is among kube-scheduler's own rights: it writes through subresources.
    // (`auth can-i` answers "no" with exit status 1.)
    for verb in ["update", "patch"] {
        let can = plane.kubectl(
            &[
                "auth",
                "can-i",
                verb,
                "pods",
                "--all-namespaces",
                "--as=system:kube-scheduler",
            ],
            None,
        );
        assert_eq!(
            text(&can.stdout).trim(),
            "no",
            "kube-scheduler's roles grant {verb} on pods"
        );
    }
    // An account of another name, with `patch` on pods from the extender's ClusterRole (step 4),
    // is not held to the policy.
    let (ok, out) = as_account(
        &format!("system:serviceaccount:{ns}:{PROBE_ACCOUNT}"),
        &["label", "--dry-run=server", "pod", "gpu-probe", "probe=yes"],
    );
    assert!(ok, "{PROBE_ACCOUNT} was refused a label: {out}");
    // kube-scheduler's writes with the same account: a nomination through pods/status, and the
    // deletion of a preemption victim.
    // (An update of pods/status, as the account may not read pods/status, which kubectl patch
    // would first.)
    let mut pod: serde_json::Value = serde_json::from_str(&plane.kubectl_ok(
        &["-n", "default", "get", "pod", "gpu-probe", "-o", "json"],
        None,
    ))
    .unwrap();
    pod["status"]["nominatedNodeName"] = serde_json::json!("gpu-node-1");
    let status_file = plane.dir.join("gpu-probe-status.json");
    std::fs::write(&status_file, pod.to_string()).unwrap();
    let (ok, out) = as_account(
        &user,
        &[
            "replace",
            "--raw",
            "/api/v1/namespaces/default/pods/gpu-probe/status",
            "-f",
            status_file.to_str().unwrap(),
        ],
    );
    assert!(ok, "a status update was refused: {out}");
    let (ok, out) = as_account(&user, &["delete", "pod", "gpu-probe", "--wait=false"]);
    assert!(ok, "a deletion was refused: {out}");
}

// ---------------------------------------------------------------------------------------------
// The node agent (deploy/node-agent/)

const AGENT_ACCOUNT: &str = "gpu-extender-node-agent";

fn agent_node(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels: {{kubernetes.io/hostname: {name}}}\n  annotations: {{other: kept}}\n"
    )
}

impl Plane {
    /// A kubeconfig of the plane's server with `token` instead of the admin's credentials.
    fn kubeconfig_with_token(&self, file: &str, token: &str) -> PathBuf {
        self.plane.kubeconfig_with_token(file, token).unwrap()
    }

    /// A token of the agent's service account; bound to a Node when `node` is given, as a
    /// kubelet-projected token is bound to the pod and its node.
    fn agent_token(&self, node: Option<&str>) -> String {
        let mut args = vec![
            "-n",
            "gpu-extender",
            "create",
            "token",
            AGENT_ACCOUNT,
            "--duration=1h",
        ];
        if let Some(node) = node {
            args.extend(["--bound-object-kind=Node", "--bound-object-name", node]);
        }
        self.kubectl_ok(&args, None).trim().to_owned()
    }

    /// `gpu-extender node-agent` with the fake backend, publishing on `node` with `kubeconfig`.
    /// Returns the process and its `/metrics` URL.
    fn start_agent(&self, kubeconfig: &Path, node: &str, fixture: &str) -> (Extender, String) {
        let metrics = format!("127.0.0.1:{}", free_port().unwrap());
        let log = self.dir.join(format!("agent-{node}.log"));
        let log_file = std::fs::File::create(&log).unwrap();
        let mut command = Command::new(EXTENDER_BIN);
        command
            .args(["node-agent", "--backend=fake", "--interval=1"])
            .arg(format!("--node-name={node}"))
            .arg(format!("--fixture={ROOT}/tests/fixtures/gpus/{fixture}"))
            .arg(format!("--metrics-address={metrics}"))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("GPU_EXTENDER_") || key == "NODE_NAME" {
                command.env_remove(key);
            }
        }
        let agent = Extender {
            child: command.spawn().unwrap(),
            log,
        };
        (agent, format!("http://{metrics}/metrics"))
    }

    fn node_annotation(&self, node: &str, key: &str) -> String {
        let path = format!(
            "jsonpath={{.metadata.annotations.{}}}",
            key.replace('.', "\\.")
        );
        self.kubectl_ok(&["get", "node", node, "-o", &path], None)
    }
}

/// Polls `done` every 200 ms for up to 60 s.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
#[ignore = "needs the Kubernetes binaries; make test runs it, or cargo test --test deploy_manifests -- --ignored"]
fn node_agent_applies_and_may_change_only_its_own_node() {
    let test = "node_agent_applies_and_may_change_only_its_own_node";
    let bins = k8s_bins(test);
    let _serial = serial();
    let base = Rendered::base(&bins);
    let agent_text = kustomize(&bins, "deploy/node-agent");
    let agent_objects = parse_documents(&agent_text, "kubectl kustomize deploy/node-agent");
    let plane = Plane::start(&bins);

    // 1. Into deploy/'s Namespace: a server-side dry run without warnings (the DaemonSet's pod
    //    passes the namespace's "restricted" Pod Security level), then for real.
    plane.apply_one(&base.objects, "Namespace");
    plane.dry_run_accepts(&agent_text, agent_objects.len(), "deploy/node-agent");
    plane.kubectl_ok(&["apply", "-f", "-"], Some(&agent_text));
    let daemon_set = find(&agent_objects, "DaemonSet", "gpu-extender-node-agent");
    let pod = &daemon_set["spec"]["template"]["spec"];
    assert_eq!(
        pod["nodeSelector"]["gpu-extender.io/node-agent"].as_str(),
        Some("true")
    );
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    let container = &pod["containers"][0];
    assert_eq!(
        container["securityContext"]["readOnlyRootFilesystem"].as_bool(),
        Some(true)
    );
    assert!(
        container["resources"]["limits"]
            .get("nvidia.com/gpu")
            .is_none()
    );

    for node in ["agent-node-a", "agent-node-b"] {
        plane.kubectl_ok(&["create", "-f", "-"], Some(&agent_node(node)));
    }
    let bound_to_a = plane.kubeconfig_with_token(
        "agent-a.kubeconfig",
        &plane.agent_token(Some("agent-node-a")),
    );
    let unbound = plane.kubeconfig_with_token("agent-unbound.kubeconfig", &plane.agent_token(None));

    // 2. The agent on its own node: the annotation appears, applied by its field manager, and
    //    what the extender reads back is the fixture's machine; nothing else changed.
    let (agent_a, _) = plane.start_agent(&bound_to_a, "agent-node-a", "dgx1-v100.yaml");
    eventually("the agent publishes on its node", || {
        !plane
            .node_annotation("agent-node-a", "gpu-extender.io/gpus")
            .is_empty()
    });
    let published = plane.node_annotation("agent-node-a", "gpu-extender.io/gpus");
    assert!(
        published.contains("Tesla-V100-SXM2-32GB") && published.contains("NV2"),
        "{published}"
    );
    assert_eq!(plane.node_annotation("agent-node-a", "other"), "kept");
    let managers = plane.kubectl_ok(
        &[
            "get",
            "node",
            "agent-node-a",
            "--show-managed-fields",
            "-o",
            "jsonpath={range .metadata.managedFields[*]}{.manager}/{.operation} {end}",
        ],
        None,
    );
    assert!(
        managers.contains("gpu-extender-node-agent/Apply"),
        "{managers}"
    );
    // Unchanged GPUs: no further writes.
    let version = plane.kubectl_ok(
        &[
            "get",
            "node",
            "agent-node-a",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ],
        None,
    );
    eventually("three more passes", || {
        agent_a.log().contains("report published") && {
            std::thread::sleep(Duration::from_secs(3));
            true
        }
    });
    let again = plane.kubectl_ok(
        &[
            "get",
            "node",
            "agent-node-a",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ],
        None,
    );
    assert_eq!(
        version,
        again,
        "the agent wrote an unchanged report:\n{}",
        agent_a.log_tail()
    );
    drop(agent_a);

    // 3. The same token aimed at another node is refused by the admission policy, and the agent
    //    says so once, though it tries again every pass.
    let (agent_b, metrics_url) = plane.start_agent(&bound_to_a, "agent-node-b", "t4-pcie.yaml");
    let refusals = |log: &str| {
        log.lines()
            .filter(|l| l.contains("may change only the node it runs on"))
            .count()
    };
    eventually("three refused passes", || {
        let (_, metrics) = curl_status(&metrics_url);
        metrics.contains("gpu_extender_agent_publishes_total{result=\"error\"} 3")
    });
    assert_eq!(refusals(&agent_b.log()), 1, "{}", agent_b.log_tail());
    assert!(
        plane
            .node_annotation("agent-node-b", "gpu-extender.io/gpus")
            .is_empty()
    );
    drop(agent_b);

    // 4. As the agent, by hand: anything but its annotation on its node, a token naming no node,
    //    and a delete are refused.
    let as_agent = |kubeconfig: &Path, args: &[&str]| {
        let mut command = Command::new(bins.join("kubectl"));
        command.args(args).env("KUBECONFIG", kubeconfig);
        let out = run(command, None);
        (
            out.status.success(),
            format!("{}{}", text(&out.stdout), text(&out.stderr)),
        )
    };
    let (ok, said) = as_agent(
        &bound_to_a,
        &["label", "node", "agent-node-a", "stolen=yes"],
    );
    assert!(
        !ok && said.contains("only the annotation gpu-extender.io/gpus"),
        "{said}"
    );
    let (ok, said) = as_agent(
        &bound_to_a,
        &[
            "annotate",
            "node",
            "agent-node-a",
            "other=changed",
            "--overwrite",
        ],
    );
    assert!(
        !ok && said.contains("only the annotation gpu-extender.io/gpus"),
        "{said}"
    );
    let (ok, said) = as_agent(
        &unbound,
        &[
            "annotate",
            "node",
            "agent-node-a",
            "gpu-extender.io/gpus={}",
            "--overwrite",
        ],
    );
    assert!(!ok && said.contains("its token names no node"), "{said}");
    let (ok, said) = as_agent(&bound_to_a, &["delete", "node", "agent-node-a"]);
    assert!(!ok && said.contains("forbidden"), "{said}");
    assert_eq!(plane.node_annotation("agent-node-a", "other"), "kept");

    // 5. The agent moved to another namespace (as an overlay's namespace transformer moves its
    //    ServiceAccount and the ClusterRoleBinding's subject) is held all the same: the policy
    //    names the account, not its namespace.
    plane.kubectl_ok(&["create", "namespace", "elsewhere"], None);
    plane.kubectl_ok(
        &["-n", "elsewhere", "create", "serviceaccount", AGENT_ACCOUNT],
        None,
    );
    plane.kubectl_ok(
        &[
            "create",
            "clusterrolebinding",
            "node-agent-elsewhere",
            &format!("--clusterrole={AGENT_ACCOUNT}"),
            &format!("--serviceaccount=elsewhere:{AGENT_ACCOUNT}"),
        ],
        None,
    );
    let token = plane.kubectl_ok(
        &[
            "-n",
            "elsewhere",
            "create",
            "token",
            AGENT_ACCOUNT,
            "--duration=1h",
            "--bound-object-kind=Node",
            "--bound-object-name",
            "agent-node-a",
        ],
        None,
    );
    let moved = plane.kubeconfig_with_token("agent-elsewhere.kubeconfig", &token);
    let (ok, said) = as_agent(&moved, &["label", "node", "agent-node-a", "stolen=yes"]);
    assert!(
        !ok && said.contains("only the annotation gpu-extender.io/gpus"),
        "{said}"
    );
    let (ok, said) = as_agent(
        &moved,
        &[
            "annotate",
            "--overwrite",
            "node",
            "agent-node-a",
            r#"gpu-extender.io/gpus={"version": 1, "gpus": []}"#,
        ],
    );
    assert!(ok, "its own annotation, refused: {said}");
}

// ---------------------------------------------------------------------------------------------
// The Helm chart (deploy/helm/gpu-extender): the objects of deploy/ with default values, the
// optional kustomizations behind values, its schema, and the API server's word on what it renders

const CHART: &str = "deploy/helm/gpu-extender";
const HELM_ENV: &str = "GPU_TEST_HELM";
/// The values that turn on every optional piece of the chart.
const EVERY_OPTION: &[&str] = &[
    "monitoring.serviceMonitor.enabled=true",
    "monitoring.dashboard.enabled=true",
    "quota.installCrd=true",
    "nodeAgent.enabled=true",
    "inspectReader.enabled=true",
    "tls.enabled=true",
    "karmadaEstimator.enabled=true",
    // The placeholder of deploy/karmada-estimator/networkpolicy.yaml.
    "karmadaEstimator.from[0].ipBlock.cidr=192.0.2.0/24",
    "autoscaling.enabled=true",
    "kubeScheduler.percentageOfNodesToScore=20",
];
/// What Helm adds to deploy/'s objects: its own labels, the pod template's configuration
/// checksum (kustomize rolls the pods through hashed ConfigMap names instead), and the
/// Namespace's keep policy.
const HELM_LABELS: &[&str] = &[
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "helm.sh/chart",
];
const HELM_ANNOTATIONS: &[&str] = &["checksum/config", "helm.sh/resource-policy"];

/// The helm binary from `$GPU_TEST_HELM` (the Makefile's test-e2e sets it from
/// scripts/helm.sh). Unset: a failure under GPU_TEST_E2E=require, otherwise `None` after
/// saying the test is skipped.
fn helm(test: &str) -> Option<Helm> {
    let Some(bin) = std::env::var_os(HELM_ENV).map(PathBuf::from) else {
        let how = format!("set {HELM_ENV} to the helm binary (built by scripts/helm.sh)");
        assert!(
            std::env::var("GPU_TEST_E2E").as_deref() != Ok("require"),
            "{test}: needs helm and GPU_TEST_E2E=require: {how}"
        );
        eprintln!("{test}: SKIPPED: no helm; {how}");
        return None;
    };
    assert!(
        bin.is_file(),
        "{test}: {HELM_ENV}={} is not a file (build helm with scripts/helm.sh)",
        bin.display()
    );
    // Helm's own config, cache and data directories, kept out of $HOME.
    let home = scratch_dir(&format!("helm-home-{test}"));
    Some(Helm { bin, home })
}

struct Helm {
    bin: PathBuf,
    home: PathBuf,
}

impl Helm {
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.bin);
        command
            .args(args)
            .env("HELM_CONFIG_HOME", self.home.join("config"))
            .env("HELM_CACHE_HOME", self.home.join("cache"))
            .env("HELM_DATA_HOME", self.home.join("data"));
        command
    }

    /// `helm <verb> [release] <chart> --namespace <ns> --set <each of set> [-f <values file>]`.
    fn on_chart(&self, verb: &str, namespace: &str, set: &[&str], file: Option<&Path>) -> Output {
        let chart = Path::new(ROOT).join(CHART);
        let chart = chart.to_str().unwrap();
        let mut args = vec![verb];
        if verb != "lint" {
            args.push("gpu-extender");
        }
        args.extend([chart, "--namespace", namespace]);
        for value in set {
            args.extend(["--set", value]);
        }
        let file = file.map(|f| f.to_str().unwrap().to_owned());
        if let Some(file) = &file {
            args.extend(["-f", file]);
        }
        run(self.command(&args), None)
    }

    /// `helm template` of the chart in `namespace`; panics with helm's message when it fails.
    fn template(&self, namespace: &str, set: &[&str]) -> String {
        let out = self.on_chart("template", namespace, set, None);
        assert!(
            out.status.success(),
            "helm template --set {set:?} failed:\n{}",
            text(&out.stderr)
        );
        text(&out.stdout)
    }
}

impl Drop for Helm {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

/// The namespace deploy/ installs into.
fn base_namespace(base: &Rendered) -> String {
    base.objects
        .iter()
        .find(|o| kind(o) == "Namespace")
        .map(|o| name(o).to_owned())
        .expect("deploy/ creates its Namespace")
}

/// kustomize's generated ConfigMaps carry a hash of their content in their names
/// (`gpu-extender-config-<hash>`); the chart's do not. The text with every such name unhashed.
fn without_config_map_hashes(rendered: &str) -> String {
    parse_documents(rendered, "kustomize output")
        .iter()
        .filter(|o| kind(o) == "ConfigMap")
        .filter_map(|o| name(o).rsplit_once('-').map(|(base, _)| (name(o), base)))
        .fold(rendered.to_owned(), |text, (hashed, base)| {
            text.replace(hashed, base)
        })
}

/// An object as the comparison with deploy/ sees it: Helm's labels and annotations removed
/// (`HELM_LABELS`, `HELM_ANNOTATIONS`), and the YAML files a ConfigMap holds parsed, so that
/// comments and layout do not count.
fn comparable(mut object: Value) -> Value {
    fn strip(metadata: &mut Value) {
        for (field, keys) in [("labels", HELM_LABELS), ("annotations", HELM_ANNOTATIONS)] {
            if let Some(map) = metadata.get_mut(field).and_then(Value::as_mapping_mut) {
                for key in keys {
                    map.remove(*key);
                }
                if map.is_empty() {
                    metadata.as_mapping_mut().unwrap().remove(field);
                }
            }
        }
    }
    strip(&mut object["metadata"]);
    if let Some(template) = object
        .get_mut("spec")
        .and_then(|s| s.get_mut("template"))
        .and_then(|t| t.get_mut("metadata"))
    {
        strip(template);
    }
    if kind(&object) == "ConfigMap"
        && let Some(data) = object.get_mut("data").and_then(Value::as_mapping_mut)
    {
        for (key, value) in data.iter_mut() {
            let file = key.as_str().unwrap_or_default();
            if file.ends_with(".yaml") || file.ends_with(".json") {
                *value = serde_yaml_ng::from_str(value.as_str().unwrap()).unwrap();
            }
        }
    }
    object
}

/// Asserts that `chart` holds exactly the objects of `expected` (by kind, namespace and name),
/// each equal to its counterpart once `comparable`.
fn assert_same_objects(chart: &[Value], expected: &[Value], what: &str) {
    let keyed = |objects: &[Value]| -> std::collections::BTreeMap<String, Value> {
        objects
            .iter()
            .map(|o| (describe(o), comparable(o.clone())))
            .collect()
    };
    let (chart, expected) = (keyed(chart), keyed(expected));
    assert_eq!(
        chart.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>(),
        "the chart renders other objects than {what}"
    );
    for (key, want) in &expected {
        let got = &chart[key];
        assert!(
            got == want,
            "{key} differs between the chart and {what}:\nchart:\n{}\n{what}:\n{}",
            serde_yaml_ng::to_string(got).unwrap(),
            serde_yaml_ng::to_string(want).unwrap()
        );
    }
}

fn helm_objects(rendered: &str) -> Vec<Value> {
    parse_documents(rendered, "helm template")
}

#[test]
#[ignore = "needs the Kubernetes binaries and helm; make test runs it, or cargo test --test deploy_manifests -- --ignored"]
fn helm_chart_renders_the_objects_of_deploy() {
    let test = "helm_chart_renders_the_objects_of_deploy";
    let bins = k8s_bins(test);
    let Some(helm) = helm(test) else { return };
    let base = Rendered::base(&bins);
    let ns = base_namespace(&base);

    // 1. Default values: deploy/, object for object.
    let kustomized = without_config_map_hashes(&base.text);
    let chart = helm.template(&ns, &[]);
    assert_same_objects(
        &helm_objects(&chart),
        &parse_documents(&kustomized, "kubectl kustomize deploy"),
        "kubectl kustomize deploy/",
    );

    // 2. Every option on: deploy/ plus its optional kustomizations and files, the same way; TLS
    //    changes only the two configurations and the Deployment's volumes, checked below.
    let mut optional = base.text.clone();
    for dir in ["deploy/monitoring", "deploy/quota", "deploy/node-agent"] {
        optional.push_str("\n---\n");
        optional.push_str(&kustomize(&bins, dir));
    }
    // The inspect reader's ClusterRole, and the karmada-estimator and autoscaling components'
    // own objects (their Deployment patches are checked in steps 4 and 5).
    for file in [
        "deploy/inspect-reader/clusterrole.yaml",
        "deploy/karmada-estimator/service.yaml",
        "deploy/karmada-estimator/networkpolicy.yaml",
        "deploy/autoscaling/service.yaml",
        "deploy/autoscaling/networkpolicy.yaml",
        "deploy/autoscaling/mutatingwebhook.yaml",
    ] {
        optional.push_str("\n---\n");
        optional.push_str(&std::fs::read_to_string(format!("{ROOT}/{file}")).unwrap());
    }
    let expected = parse_documents(&without_config_map_hashes(&optional), "deploy/ and options");
    let every = helm_objects(&helm.template(&ns, EVERY_OPTION));
    let tls_free = |objects: &[Value]| -> Vec<Value> {
        objects
            .iter()
            .filter(|o| !matches!(kind(o), "Deployment" | "ConfigMap"))
            .cloned()
            .collect()
    };
    assert_same_objects(
        &tls_free(&every),
        &tls_free(&expected),
        "deploy/ and its options",
    );

    // The dashboard ConfigMap holds deploy/monitoring/grafana-dashboard.json.
    let dashboard = find(&every, "ConfigMap", "gpu-extender-dashboard");
    assert_eq!(label(dashboard, "grafana_dashboard"), Some("1"));
    let shipped: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{ROOT}/deploy/monitoring/grafana-dashboard.json"))
            .unwrap(),
    )
    .unwrap();
    let held: serde_json::Value =
        serde_json::from_str(dashboard["data"]["gpu-extender.json"].as_str().unwrap()).unwrap();
    assert_eq!(held, shipped);

    // 3. TLS: the extender serves the mounted Secret's pair, kube-scheduler dials https and
    //    trusts the Secret's ca.crt, and check-config accepts the extender's side.
    let with_tls = Rendered {
        text: String::new(),
        objects: every,
    };
    let scratch = scratch_dir("helm-tls");
    let config = effective_extender_config(&with_tls.extender_config_text(), &scratch, &[]);
    let _ = std::fs::remove_dir_all(&scratch);
    let cert = config["server"]["tls"]["certFile"].as_str().unwrap();
    let stanza = &with_tls.scheduler_config()["extenders"][0];
    assert_eq!(
        stanza["urlPrefix"].as_str(),
        Some("https://127.0.0.1:8888/scheduler")
    );
    assert_eq!(stanza["enableHTTPS"].as_bool(), Some(true));
    let ca = stanza["tlsConfig"]["caFile"].as_str().unwrap();
    let secret_mount = |container: &str, file: &str| {
        let (dir, _) = file.rsplit_once('/').unwrap();
        let mount = with_tls.container(container)["volumeMounts"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"].as_str() == Some(dir))
            .unwrap_or_else(|| panic!("{container}: nothing mounted at {dir}"));
        let volume = with_tls.pod_spec()["volumes"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap();
        volume["secret"]["secretName"].as_str().unwrap().to_owned()
    };
    assert_eq!(secret_mount("gpu-extender", cert), "gpu-extender-tls");
    assert_eq!(secret_mount("kube-scheduler", ca), "gpu-extender-tls");
    // kube-scheduler sees the CA alone: every Secret it mounts is limited to ca.crt, so the
    // private key is nowhere in its filesystem.
    for mount in with_tls.container("kube-scheduler")["volumeMounts"]
        .as_sequence()
        .unwrap()
    {
        let volume = with_tls.pod_spec()["volumes"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap();
        assert!(
            volume.get("projected").is_none(),
            "kube-scheduler mounts a projected volume: {volume:?}"
        );
        if let Some(secret) = volume.get("secret") {
            let items: Vec<(&str, &str)> = secret["items"]
                .as_sequence()
                .unwrap_or_else(|| panic!("kube-scheduler mounts a whole Secret: {volume:?}"))
                .iter()
                .map(|i| (i["key"].as_str().unwrap(), i["path"].as_str().unwrap()))
                .collect();
            assert_eq!(items, [("ca.crt", "ca.crt")], "{volume:?}");
        }
    }
    // The window: set when given (EVERY_OPTION sets 20), left out by default, as deploy/ leaves
    // it (kube-scheduler's adaptive default), whatever the policy, and when 0 is given
    // (decision 0012; a 5% window with fgd-plus did not keep its placements on other clusters).
    assert_eq!(
        with_tls.scheduler_config()["percentageOfNodesToScore"].as_u64(),
        Some(20)
    );
    let by_default = Rendered {
        text: String::new(),
        objects: helm_objects(&chart),
    };
    assert!(
        by_default
            .scheduler_config()
            .get("percentageOfNodesToScore")
            .is_none()
    );
    let window_with = |set: &[&str]| {
        Rendered {
            text: String::new(),
            objects: helm_objects(&helm.template(&ns, set)),
        }
        .scheduler_config()
        .get("percentageOfNodesToScore")
        .and_then(Value::as_u64)
    };
    assert_eq!(window_with(&["config.policy.scoring=fgd-plus"]), None);
    assert_eq!(window_with(&["config.policy.scoring=fgd"]), None);
    assert_eq!(
        window_with(&[
            "config.policy.scoring=fgd-plus",
            "kubeScheduler.percentageOfNodesToScore=0"
        ]),
        None
    );
    assert_eq!(
        window_with(&[
            "config.policy.scoring=fgd-plus",
            "kubeScheduler.percentageOfNodesToScore=30"
        ]),
        Some(30)
    );

    // 4. The Karmada estimator: deploy/ with its karmada-estimator component, object for object
    //    (the Deployment's env and port included).
    let scratch = scratch_dir("helm-karmada-estimator");
    let with_component = kustomize_with_karmada_estimator(&bins, &scratch);
    let _ = std::fs::remove_dir_all(&scratch);
    assert_same_objects(
        &helm_objects(&helm.template(
            &ns,
            &[
                "karmadaEstimator.enabled=true",
                "karmadaEstimator.from[0].ipBlock.cidr=192.0.2.0/24",
            ],
        )),
        &parse_documents(
            &without_config_map_hashes(&with_component),
            "deploy/ with karmada-estimator",
        ),
        "deploy/ with the karmada-estimator component",
    );

    // 5. Autoscaled pools: deploy/ with its autoscaling component, object for object (the
    //    Deployment's env, port and certificate volume, the Service, the NetworkPolicy and the
    //    MutatingWebhookConfiguration, cert-manager's CA annotation included).
    let scratch = scratch_dir("helm-autoscaling");
    let with_component = kustomize_with_component(&bins, &scratch, "autoscaling");
    let _ = std::fs::remove_dir_all(&scratch);
    assert_same_objects(
        &helm_objects(&helm.template(&ns, &["autoscaling.enabled=true"])),
        &parse_documents(
            &without_config_map_hashes(&with_component),
            "deploy/ with autoscaling",
        ),
        "deploy/ with the autoscaling component",
    );
}

#[test]
#[ignore = "needs helm; make test runs it, or cargo test --test deploy_manifests -- --ignored"]
fn helm_admin_tls_serves_the_admin_port_over_https_to_probes_and_prometheus() {
    let test = "helm_admin_tls_serves_the_admin_port_over_https_to_probes_and_prometheus";
    let Some(helm) = helm(test) else { return };
    let objects = helm_objects(&helm.template(
        "gpu-extender",
        &[
            "adminTls.enabled=true",
            "monitoring.serviceMonitor.enabled=true",
        ],
    ));
    let config_map = find(&objects, "ConfigMap", "gpu-extender-config");
    let config: Value =
        serde_yaml_ng::from_str(config_map["data"]["config.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(
        config["server"]["adminTls"]["certFile"].as_str(),
        Some("/etc/gpu-extender/admin-tls/tls.crt"),
        "{config:?}"
    );
    let deployment = find(&objects, "Deployment", "gpu-scheduler");
    let pod = &deployment["spec"]["template"]["spec"];
    let extender = pod["initContainers"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"].as_str() == Some("gpu-extender"))
        .unwrap();
    for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
        assert_eq!(
            extender[probe]["httpGet"]["scheme"].as_str(),
            Some("HTTPS"),
            "{probe}"
        );
    }
    assert!(
        extender["volumeMounts"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|m| m["mountPath"].as_str() == Some("/etc/gpu-extender/admin-tls")),
        "the admin Secret is mounted into the extender"
    );
    let monitor = find(&objects, "ServiceMonitor", "gpu-extender");
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["scheme"].as_str(), Some("https"));
    assert_eq!(
        endpoint["tlsConfig"]["ca"]["secret"]["name"].as_str(),
        Some("gpu-extender-admin-tls")
    );
}

#[test]
#[ignore = "needs helm; make test runs it, or cargo test --test deploy_manifests -- --ignored"]
fn helm_lint_passes_and_the_schema_refuses_bad_values() {
    let test = "helm_lint_passes_and_the_schema_refuses_bad_values";
    let Some(helm) = helm(test) else { return };
    // The estimator without a Secret is accepted only with the explicit opt-out.
    let unauthenticated_estimator = &[
        "karmadaEstimator.enabled=true",
        "karmadaEstimator.allowUnauthenticated=true",
        "karmadaEstimator.tls.secretName=",
        "karmadaEstimator.from[0].ipBlock.cidr=192.0.2.0/24",
    ][..];
    for set in [&[][..], EVERY_OPTION, unauthenticated_estimator] {
        let out = helm.on_chart("lint", "gpu-extender", set, None);
        let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(
            out.status.success() && said.contains("0 chart(s) failed"),
            "helm lint --set {set:?}:\n{said}"
        );
        assert!(
            !said.contains("[WARNING]"),
            "helm lint --set {set:?}:\n{said}"
        );
    }

    // Each bad values file is refused by lint and template, naming what is wrong.
    let scratch = scratch_dir("helm-bad-values");
    let bad = [
        (
            "config:\n  policy:\n    scoring: binpak\n",
            "'/config/policy/scoring': value must be one of 'binpack', 'spread', 'fgd', 'fgd-plus'",
        ),
        (
            "replica: 3\n",
            "additional properties 'replica' not allowed",
        ),
        ("replicas: 0\n", "'/replicas': minimum: got 0, want 1"),
        (
            "kubeScheduler:\n  percentageOfNodesToScore: 101\n",
            "'/kubeScheduler/percentageOfNodesToScore': maximum: got 101, want 100",
        ),
        (
            "config:\n  policy:\n    scorng: spread\n",
            "'/config/policy': additional properties 'scorng' not allowed",
        ),
        (
            "config:\n  server:\n    listen: localhost\n",
            "'/config/server/listen': 'localhost' does not match pattern",
        ),
        // Two replicas (the default) without leader election.
        (
            "leaderElection:\n  enabled: false\n",
            "'/leaderElection/enabled': value must be true",
        ),
        // The estimator on a load balancer open to every address.
        (
            "karmadaEstimator:\n  enabled: true\n  serviceType: LoadBalancer\n  from: [{ipBlock: {cidr: 192.0.2.0/24}}]\n",
            "'/karmadaEstimator/loadBalancerSourceRanges': minItems: got 0, want 1",
        ),
        // The estimator off loopback with neither client certificates nor the opt-out.
        (
            "karmadaEstimator:\n  enabled: true\n  from: [{ipBlock: {cidr: 192.0.2.0/24}}]\n  tls:\n    secretName: \"\"\n",
            "'/karmadaEstimator/tls/secretName': minLength: got 0, want 1",
        ),
        // The estimator behind the NetworkPolicy with no source admitted.
        (
            "karmadaEstimator:\n  enabled: true\n",
            "'/karmadaEstimator/from': minItems: got 0, want 1",
        ),
        // A NetworkPolicy peer that is not one.
        (
            "networkPolicy:\n  metricsFrom: [{namespace: monitoring}]\n",
            "additional properties 'namespace' not allowed",
        ),
    ];
    for (values, says) in bad {
        let file = scratch.join("values.yaml");
        std::fs::write(&file, values).unwrap();
        for verb in ["lint", "template"] {
            let out = helm.on_chart(verb, "gpu-extender", &[], Some(&file));
            let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
            assert!(
                !out.status.success() && said.contains(says),
                "helm {verb} with\n{values}should fail saying {says:?}:\n{said}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(scratch);

    // A cluster without ValidatingAdmissionPolicy (before 1.30) is refused whole: the chart's
    // policies narrow the rights its RBAC grants.
    let chart = Path::new(ROOT).join(CHART);
    let out = run(
        helm.command(&[
            "template",
            "gpu-extender",
            chart.to_str().unwrap(),
            "--kube-version",
            "1.29.9",
            "--set",
            "nodeAgent.enabled=true",
        ]),
        None,
    );
    let said = text(&out.stderr);
    assert!(
        !out.status.success() && said.contains("requires kubeVersion: >=1.30.0-0"),
        "helm template for Kubernetes 1.29:\n{said}"
    );
}

/// The chart's NetworkPolicies admit what the values name: `networkPolicy.metricsFrom` as given,
/// and an empty list no one (no rule at all: a rule without `from` would admit everyone);
/// `karmadaEstimator.from` likewise on the estimator's port.
#[test]
#[ignore = "needs helm; make test runs it, or cargo test --test deploy_manifests -- --ignored"]
fn helm_network_policies_admit_the_sources_in_the_values() {
    let test = "helm_network_policies_admit_the_sources_in_the_values";
    let Some(helm) = helm(test) else { return };
    let policy = |set: &[&str], name: &str| -> Value {
        find(
            &helm_objects(&helm.template("gpu-extender", set)),
            "NetworkPolicy",
            name,
        )
        .clone()
    };
    let closed = policy(&["networkPolicy.metricsFrom=null"], "gpu-scheduler");
    assert_eq!(
        closed["spec"]["ingress"].as_sequence().map(Vec::len),
        Some(0),
        "{closed:?}"
    );
    assert_eq!(closed["spec"]["policyTypes"][0].as_str(), Some("Ingress"));
    let prometheus = policy(
        &[
            "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=obs",
            "networkPolicy.metricsFrom[0].podSelector.matchLabels.app=prometheus",
        ],
        "gpu-scheduler",
    );
    let peers: Value = serde_yaml_ng::from_str(
        "[{namespaceSelector: {matchLabels: {team: obs}}, podSelector: {matchLabels: {app: prometheus}}}]",
    )
    .unwrap();
    assert_eq!(prometheus["spec"]["ingress"][0]["from"], peers);
    let estimator = policy(
        &[
            "karmadaEstimator.enabled=true",
            "karmadaEstimator.from[0].ipBlock.cidr=203.0.113.0/24",
        ],
        "gpu-scheduler-estimator",
    );
    assert_eq!(
        estimator["spec"]["ingress"][0]["from"][0]["ipBlock"]["cidr"].as_str(),
        Some("203.0.113.0/24")
    );
}

/// The chart's pod-write policy names the requeue annotation the configuration names.
#[test]
#[ignore = "needs helm; make test runs it, or cargo test --test deploy_manifests -- --ignored"]
fn helm_pod_write_policy_follows_the_requeue_key() {
    let test = "helm_pod_write_policy_follows_the_requeue_key";
    let Some(helm) = helm(test) else { return };
    let key = |set: &[&str]| -> String {
        let objects = helm_objects(&helm.template("gpu-extender", set));
        let policy = find(
            &objects,
            "ValidatingAdmissionPolicy",
            "gpu-extender-pod-writes",
        );
        policy["spec"]["variables"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|v| v["name"].as_str() == Some("key"))
            .and_then(|v| v["expression"].as_str())
            .unwrap()
            .to_owned()
    };
    assert_eq!(key(&[]), format!("'{REQUEUE}'"));
    assert_eq!(
        key(&["config.annotations.requeue=example.com/retry"]),
        "'example.com/retry'"
    );
}

/// The chart's schema names the configuration keys the binary reads, section by section, and
/// no other (a typo in `config:` fails `helm install`, not the pod's start).
#[test]
fn helm_chart_schema_names_the_config_keys_the_binary_reads() {
    let path = format!("{ROOT}/{CHART}/values.schema.json");
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let config = &schema["properties"]["config"];
    assert_eq!(
        config["additionalProperties"],
        serde_json::Value::Bool(false)
    );
    let mut in_schema = std::collections::BTreeSet::new();
    for (section, keys) in config["properties"].as_object().unwrap() {
        assert_eq!(
            keys["additionalProperties"],
            serde_json::Value::Bool(false),
            "config.{section} should refuse unknown keys"
        );
        for key in keys["properties"].as_object().unwrap().keys() {
            in_schema.insert(format!("{section}.{key}"));
        }
    }
    let read: std::collections::BTreeSet<String> = gpu_extender::config::KEYS
        .iter()
        .map(|key| key.split('.').take(2).collect::<Vec<_>>().join("."))
        .collect();
    assert_eq!(in_schema, read, "{path} against src/config/mod.rs KEYS");
}

/// Every value the schema allows is in the values table of docs/install.md ("Installing with
/// Helm"), and every value there is one the schema allows.
#[test]
fn helm_chart_values_are_documented() {
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{ROOT}/{CHART}/values.schema.json")).unwrap(),
    )
    .unwrap();
    let docs = std::fs::read_to_string(format!("{ROOT}/docs/install.md")).unwrap();
    let section = docs
        .split("\n## ")
        .find(|s| s.starts_with("Installing with Helm"))
        .expect("docs/install.md has a section Installing with Helm");
    // The table's first column: `a.b`, `.c` (a sibling of the previous), `a.b.*`.
    let mut documented = std::collections::BTreeSet::new();
    for row in section.lines().filter(|l| l.starts_with("| `")) {
        let first = row.split(" | ").next().unwrap();
        for name in first.split('`').skip(1).step_by(2) {
            let top = name.split('.').next().unwrap_or_default();
            if !top.is_empty() {
                documented.insert(top.to_owned());
            }
        }
    }
    let allowed: std::collections::BTreeSet<String> = schema["properties"]
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| *k != "global") // Helm's own, shared with subcharts
        .cloned()
        .collect();
    assert_eq!(
        documented, allowed,
        "docs/install.md's values table against the schema"
    );
}

/// The chart reads the CRD and the dashboard from files of its own (Helm reads no file outside
/// the chart); they must stay the copies of deploy/'s.
#[test]
fn helm_chart_files_are_copies_of_deploy() {
    for (copy, original) in [
        (
            "files/elasticquota-crd.yaml",
            "deploy/quota/elasticquota-crd.yaml",
        ),
        (
            "files/grafana-dashboard.json",
            "deploy/monitoring/grafana-dashboard.json",
        ),
    ] {
        let copy_path = format!("{ROOT}/{CHART}/{copy}");
        assert!(
            std::fs::read(&copy_path).unwrap()
                == std::fs::read(format!("{ROOT}/{original}")).unwrap(),
            "{copy_path} differs from {original}: cp {original} {CHART}/{copy}"
        );
    }
}

#[test]
#[ignore = "needs the Kubernetes binaries and helm; make test runs it, or cargo test --test deploy_manifests -- --ignored"]
fn helm_chart_applies_to_a_real_api_server() {
    let test = "helm_chart_applies_to_a_real_api_server";
    let bins = k8s_bins(test);
    let Some(helm) = helm(test) else { return };
    let _serial = serial();
    let ns = base_namespace(&Rendered::base(&bins));
    // Everything on; the ServiceMonitor only when its CRD is given (GPU_TEST_SERVICEMONITOR_CRD):
    // the plane has no Prometheus Operator. It is deploy/monitoring's object either way
    // (helm_chart_renders_the_objects_of_deploy).
    let service_monitor_crd = std::env::var(CRD_ENV).ok();
    let set: Vec<&str> = EVERY_OPTION
        .iter()
        .copied()
        .filter(|v| service_monitor_crd.is_some() || !v.starts_with("monitoring.serviceMonitor."))
        .collect();
    let rendered = helm.template(&ns, &set);
    let objects = helm_objects(&rendered);
    let plane = Plane::start(&bins);
    match &service_monitor_crd {
        Some(crd) => plane.install_service_monitor_crd(crd),
        None => eprintln!(
            "{test}: the ServiceMonitor CRD is not installed; the chart was dry-run without its \
             ServiceMonitor (set {CRD_ENV} to the CRD file to include it)"
        ),
    }

    // 1. Created for real first: the Namespace and the CRD.
    plane.apply_one(&objects, "Namespace");
    plane.apply_one(&objects, "CustomResourceDefinition");

    // 2. A server-side dry run of everything: accepted without warnings (those include the
    //    namespace's restricted Pod Security level, checked on the pod templates).
    plane.dry_run_accepts(&rendered, objects.len(), "the chart");

    // 3. helm install as docs/install.md says, into the Namespace that exists, then uninstall;
    //    the Namespace stays (the release's record lives there).
    let kubeconfig = plane.dir.join("kubeconfig");
    let kubeconfig = kubeconfig.to_str().unwrap();
    let chart = format!("{ROOT}/{CHART}");
    let helm_ok = |args: &[&str]| {
        let mut command = helm.command(args);
        command.env("KUBECONFIG", kubeconfig);
        let out = run(command, None);
        assert!(
            out.status.success(),
            "helm {}:\n{}{}",
            args.join(" "),
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    };
    helm_ok(&[
        "install",
        "gpu-extender",
        &chart,
        "--namespace",
        &ns,
        "--create-namespace",
        "--take-ownership",
    ]);
    let deployed = plane.kubectl_ok(
        &[
            "-n",
            &ns,
            "get",
            "deployment,configmap,serviceaccount",
            "-o",
            "name",
        ],
        None,
    );
    for object in [
        "deployment.apps/gpu-scheduler",
        "configmap/gpu-extender-config",
        "configmap/gpu-scheduler-config",
        "serviceaccount/gpu-scheduler",
    ] {
        assert!(deployed.contains(object), "{object} missing:\n{deployed}");
    }
    helm_ok(&["uninstall", "gpu-extender", "--namespace", &ns]);
    let left = plane.kubectl_ok(&["-n", &ns, "get", "deployment", "-o", "name"], None);
    assert!(left.trim().is_empty(), "left after uninstall: {left}");
    plane.kubectl_ok(&["get", "namespace", &ns], None);
}
