//! The configuration's unit tests: sources and precedence, validation, flags and names.

use std::collections::BTreeSet;

use serde_yaml_ng::Value;

use super::*;

/// `--set` overrides, with the origin `ConfigFlags` gives them.
fn set(pairs: &[(&str, &str)]) -> Vec<(String, String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned(), format!("flag --set {k}")))
        .collect()
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn from_yaml(yaml: &str) -> Result<Config, ConfigError> {
    Config::from_sources(Some(("test.yaml", yaml)), &[], &[])
}

#[test]
fn defaults_are_the_documented_names_and_valid() {
    let cfg = Config::from_sources(None, &[], &[]).unwrap();
    assert_eq!(cfg, Config::default());
    assert_eq!(cfg.resources.whole_gpu, "nvidia.com/gpu");
    assert_eq!(cfg.resources.gpu_mem, "aliyun.com/gpu-mem");
    assert_eq!(cfg.resources.gpu_core, "aliyun.com/gpu-core.percentage");
    assert_eq!(cfg.resources.topology_gpu, "aliyun.com/gpu");
    assert_eq!(cfg.resources.gpu_count, "aliyun.com/gpu-count");
    assert_eq!(cfg.node_labels.mode, "ack.node.gpu.schedule");
    assert_eq!(cfg.node_labels.gfd_memory, "nvidia.com/gpu.memory");
    assert!(cfg.annotations.allocation.starts_with("gpu-extender.io/"));
    assert!(!cfg.gpushare.enabled);
    assert_eq!(cfg.policy.scoring, ScoringPolicy::Binpack);
    assert_eq!(cfg.policy.max_pods_per_shared_gpu, 20);
    assert_eq!(cfg.server.listen.to_string(), "127.0.0.1:8888");
    assert_eq!(cfg.server.admin_listen.to_string(), "0.0.0.0:9090");
    assert_eq!(cfg.server.url_prefix, "/scheduler");
    assert_eq!(cfg.server.body_limit_bytes, 8 << 20);
    assert_eq!(cfg.server.request_timeout_ms, 2000);
    assert_eq!(cfg.bind.reservation_ttl_seconds, 120);
    assert_eq!(cfg.reservation_ttl_ms(), 120_000);
    assert_eq!(cfg.engine_policy().max_shares_per_gpu, 20);
    // An empty file and a comment-only file are the defaults too.
    assert_eq!(from_yaml("").unwrap(), Config::default());
    assert_eq!(from_yaml("# nothing\n").unwrap(), Config::default());
}

#[test]
fn a_full_file_sets_every_section() {
    let yaml = r#"
resources:
  wholeGpu: example.com/gpu
  gpuMem: nvidia.com/gpumem
  gpuCore: nvidia.com/gpucores
  topologyGpu: example.com/topo-gpu
  gpuCount: example.com/gpu-count
nodeLabels:
  mode: example.com/gpu-mode
  placement: example.com/gpu-placement
  model: example.com/gpu-model
  memory: example.com/gpu-memory
  count: example.com/gpu-count
  gfdProduct: nvidia.com/gpu.product
  gfdMemory: nvidia.com/gpu.memory
  gfdCount: nvidia.com/gpu.count
annotations:
  allocation: example.com/alloc
  nodeGpus: example.com/gpus
  modelInclude: example.com/include
  modelExclude: example.com/exclude
  minGpuMemory: example.com/min-mem
  placement: example.com/placement
  topology: example.com/topology
gpushare:
  enabled: true
policy:
  scoring: fgd
  maxPodsPerSharedGpu: 8
  typicalPods:
    learn: false
    pods:
      - {cpuMilli: 4000, gpus: 1, gpuMilli: 500, weight: 3}
      - {cpuMilli: 8000, gpus: 8, gpuMilli: 1000, models: ["A100*"], weight: 1}
server:
  listen: 0.0.0.0:8443
  urlPrefix: /gpu
  adminListen: 127.0.0.1:9091
  bodyLimitBytes: 1048576
  tls: {certFile: /tls/tls.crt, keyFile: /tls/tls.key}
  allowUnauthenticatedVerbs: true
  requestTimeoutMs: 1500
bind:
  reservationTtlSeconds: 30
limits:
  maxConcurrentRequests: 16
"#;
    let cfg = from_yaml(yaml).unwrap();
    assert_eq!(cfg.resources.gpu_mem, "nvidia.com/gpumem");
    assert_eq!(cfg.node_labels.count, "example.com/gpu-count");
    assert_eq!(cfg.annotations.topology, "example.com/topology");
    assert!(cfg.gpushare.enabled);
    assert_eq!(cfg.policy.scoring, ScoringPolicy::Fgd);
    assert_eq!(cfg.policy.typical_pods.pods.len(), 2);
    assert_eq!(cfg.server.listen.port(), 8443);
    assert_eq!(
        cfg.server.tls.as_ref().map(|t| t.key_file.clone()),
        Some(PathBuf::from("/tls/tls.key"))
    );
    assert_eq!(cfg.bind.reservation_ttl_seconds, 30);
    assert_eq!(cfg.limits.max_concurrent_requests, 16);
    let policy = cfg.engine_policy();
    assert_eq!(policy.max_shares_per_gpu, 8);
    assert_eq!(policy.typical.pods().len(), 2);
    assert!((policy.typical.pods()[0].weight - 0.75).abs() < 1e-9);
    // What --print-config shows reads back as the same configuration.
    assert_eq!(from_yaml(&cfg.to_yaml()).unwrap(), cfg);
}

#[test]
fn the_example_file_in_deploy_is_valid() {
    let text = include_str!("../../deploy/config.example.yaml");
    from_yaml(text).unwrap();
}

#[test]
fn the_scarcity_measure_is_chosen_by_name_under_its_new_key_and_its_old_one() {
    for (name, engine) in [
        ("now", Scarcity::Now),
        ("shape", Scarcity::Shape),
        ("empty", Scarcity::Empty),
    ] {
        let yaml = format!("policy:\n  fgdPlus:\n    scarcity:\n      measured: {name}\n");
        let cfg = from_yaml(&yaml).unwrap();
        assert_eq!(
            cfg.engine_policy().fgd_plus.scarcity.measured,
            engine,
            "{name}"
        );
        let old = format!("policy:\n  typicalPods:\n    scarcity: {name}\n");
        let cfg = from_yaml(&old).unwrap();
        assert_eq!(
            cfg.engine_policy().fgd_plus.scarcity.measured,
            engine,
            "{name}"
        );
    }
    assert_eq!(ScarcityConfig::default().engine(), Scarcity::Now);
    assert!(from_yaml("policy:\n  typicalPods:\n    scarcity: later\n").is_err());
    // Both names, differently: refused, naming both keys.
    let both = "policy:\n  typicalPods:\n    scarcity: empty\n  fgdPlus:\n    scarcity:\n      measured: shape\n";
    let err = from_yaml(both).unwrap_err().to_string();
    assert!(err.contains("policy.typicalPods.scarcity"), "{err}");
    assert!(err.contains("policy.fgdPlus.scarcity.measured"), "{err}");
}

/// `policy.fgdPlus` carries every knob of the engine's FGD+ by the engine's own keys: its
/// defaults are the engine's, and each key set as an override changes the engine's tuning
/// exactly as `Tuning::set` (what `gpu-lab simulate` takes) does with the same text.
#[test]
fn policy_fgd_plus_sets_every_knob_by_the_engine_s_key() {
    assert_eq!(
        Config::default().engine_policy().fgd_plus,
        fgd_plus::Tuning::default()
    );
    for (key, value) in fgd_plus::Tuning::default().knobs() {
        let other = match value.as_str() {
            "true" => "false".to_owned(),
            "now" => "shape".to_owned(),
            number => (number.parse::<u32>().unwrap() + 3).to_string(),
        };
        let cfg = Config::default()
            .with_override(&format!("policy.fgdPlus.{key}"), &other, "test")
            .unwrap();
        let mut expected = fgd_plus::Tuning::default();
        expected.set(key, &other).unwrap();
        assert_eq!(cfg.engine_policy().fgd_plus, expected, "{key}={other}");
    }
}

#[test]
fn a_typo_names_the_field_and_where_it_is() {
    let err = from_yaml("policy:\n  scorng: spread\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown field `scorng`"), "{err}");
    assert!(err.contains("policy"), "{err}");
    assert!(err.contains("line 2"), "{err}");
    let err = from_yaml("sever:\n  listen: 1.2.3.4:5\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown field `sever`"), "{err}");
}

#[test]
fn the_host_hold_is_on_by_default_and_reaches_fgd_plus_tuning() {
    assert!(Config::default().policy.fgd_plus.hold_host_for_gpus);
    assert!(Config::default().engine_policy().fgd_plus.hold_host);
    let cfg = Config::from_sources(
        None,
        &env(&[("GPU_EXTENDER_POLICY_FGD_PLUS_HOLD_HOST_FOR_GPUS", "false")]),
        &[],
    )
    .unwrap();
    assert!(!cfg.engine_policy().fgd_plus.hold_host);
    // The old key, in a file written before `policy.fgdPlus`, still turns it off.
    let old = from_yaml("policy:\n  holdHostForGpus: false\n").unwrap();
    assert!(!old.engine_policy().fgd_plus.hold_host);
}

#[test]
fn an_invalid_value_names_the_key_and_the_choices() {
    let err = from_yaml("policy:\n  scoring: binpak\n")
        .unwrap_err()
        .to_string();
    assert!(
            err.contains(
                r#"policy.scoring: unknown policy "binpak"; expected one of binpack, spread, fgd, fgd-plus"#
            ),
            "{err}"
        );
    let err = from_yaml("server:\n  listen: localhost\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("server.listen"), "{err}");
    let err = from_yaml("policy:\n  maxPodsPerSharedGpu: 0\nbind:\n  reservationTtlSeconds: 0\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("policy.maxPodsPerSharedGpu: 0 is out of range"),
        "{err}"
    );
    assert!(
        err.contains("bind.reservationTtlSeconds"),
        "both problems are listed: {err}"
    );
    let err = from_yaml("resources:\n  gpuMem: gpu-mem\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("resources.gpuMem"), "{err}");
    let err = from_yaml("policy:\n  scoring: fgd\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("policy.typicalPods"), "{err}");
    let err = from_yaml("policy:\n  typicalPods:\n    pods: [{gpus: 1, gpuMilli: 500, weight: 1, models: [\"A|B\"]}]\n")
            .unwrap_err()
            .to_string();
    assert!(err.contains("policy.typicalPods.pods[0]"), "{err}");
    let err = from_yaml("server:\n  tls: {certFile: /a}\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("keyFile"), "{err}");
    let err =
        from_yaml("estimator:\n  tls: {certFile: /a, keyFile: /b, reloadIntervalSeconds: 0}\n")
            .unwrap_err()
            .to_string();
    assert!(err.contains("estimator.tls.reloadIntervalSeconds"), "{err}");
}

#[test]
fn mig_device_classes_default_to_nvidias_and_must_not_be_whole_gpu_classes() {
    let driver = &Config::default().dra.drivers[0];
    assert_eq!(driver.mig_device_classes, ["mig.nvidia.com"]);
    let cfg = from_yaml("dra:\n  drivers:\n    - migDeviceClasses: [mig-small]\n").unwrap();
    assert_eq!(cfg.dra.drivers[0].mig_device_classes, ["mig-small"]);
    assert_eq!(cfg.dra.drivers[0].device_classes, ["gpu.nvidia.com"]);
    let err = from_yaml("dra:\n  drivers:\n    - migDeviceClasses: [gpu.nvidia.com]\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("dra.drivers[0]: DeviceClass \"gpu.nvidia.com\" is listed both"),
        "{err}"
    );
}

#[test]
fn an_estimator_off_loopback_requires_client_certificates_or_the_opt_out() {
    // Off loopback without a client CA: refused, naming the keys that would fix it.
    for listen in ["0.0.0.0:10352", "192.0.2.7:10352", "[::]:10352"] {
        for tls in ["", "  tls: {certFile: /c, keyFile: /k}\n"] {
            let err = from_yaml(&format!("estimator:\n  listen: \"{listen}\"\n{tls}"))
                .unwrap_err()
                .to_string();
            assert!(err.contains("estimator.listen"), "{err}");
            for key in [
                "estimator.tls.clientCaFile",
                "estimator.tls.certFile",
                "estimator.allowUnauthenticated",
            ] {
                assert!(err.contains(key), "{listen} {tls:?}: {err}");
            }
        }
    }
    // With client certificates required, or the explicit opt-out, it starts.
    let mutual = "estimator:\n  listen: 0.0.0.0:10352\n  tls: {certFile: /c, keyFile: /k, \
                  clientCaFile: /ca}\n";
    assert!(from_yaml(mutual).is_ok());
    let opted_out = "estimator:\n  listen: 0.0.0.0:10352\n  allowUnauthenticated: true\n";
    assert!(
        from_yaml(opted_out)
            .unwrap()
            .estimator
            .allow_unauthenticated
    );
    // Loopback (v4, v6 and v4-mapped) needs neither.
    for listen in ["127.0.0.1:10352", "[::1]:10352", "[::ffff:127.0.0.1]:10352"] {
        let config = from_yaml(&format!("estimator:\n  listen: \"{listen}\"\n"));
        assert!(config.is_ok(), "{listen}: {config:?}");
    }
    // The environment's address counts the same as the file's.
    let env = [(
        "GPU_EXTENDER_ESTIMATOR_LISTEN".to_owned(),
        "0.0.0.0:10352".to_owned(),
    )];
    let err = Config::from_sources(None, &env, &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("estimator.allowUnauthenticated"), "{err}");
}

#[test]
fn estimator_concurrency_is_bounded() {
    assert_eq!(Config::default().estimator.max_concurrent_requests, 16);
    for bad in [0, 1025] {
        let err = from_yaml(&format!("estimator:\n  maxConcurrentRequests: {bad}\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("estimator.maxConcurrentRequests"), "{err}");
    }
    assert!(from_yaml("estimator:\n  maxConcurrentRequests: 1\n").is_ok());
}

#[test]
fn env_overrides_the_file_and_flags_override_env() {
    let yaml = "policy:\n  scoring: spread\n  maxPodsPerSharedGpu: 10\n";
    let vars = env(&[
        ("GPU_EXTENDER_POLICY_MAX_PODS_PER_SHARED_GPU", "12"),
        ("GPU_EXTENDER_GPUSHARE_ENABLED", "true"),
        ("GPU_EXTENDER_SERVER_URL_PREFIX", "/x"),
        ("GPU_EXTENDER_SERVER_TLS_CERT_FILE", "/c.pem"),
        ("GPU_EXTENDER_SERVER_TLS_KEY_FILE", "/k.pem"),
        ("GPU_EXTENDER_CONFIG", "/ignored/here.yaml"),
        ("HOME", "/root"),
    ]);
    let flags = set(&[("policy.maxPodsPerSharedGpu", "14")]);
    let cfg = Config::from_sources(Some(("f", yaml)), &vars, &flags).unwrap();
    assert_eq!(cfg.policy.scoring, ScoringPolicy::Spread);
    assert_eq!(cfg.policy.max_pods_per_shared_gpu, 14);
    assert!(cfg.gpushare.enabled);
    assert_eq!(cfg.server.url_prefix, "/x");
    assert_eq!(
        cfg.server.tls,
        Some(TlsConfig {
            cert_file: "/c.pem".into(),
            key_file: "/k.pem".into(),
            ..TlsConfig::default()
        })
    );
    let cfg = Config::from_sources(
        None,
        &env(&[("GPU_EXTENDER_POLICY_MAX_PODS_PER_SHARED_GPU", "12")]),
        &[],
    )
    .unwrap();
    assert_eq!(cfg.policy.max_pods_per_shared_gpu, 12);
}

#[test]
fn overrides_take_yaml_values_and_plain_strings() {
    let flags = set(&[
        (
            "policy.typicalPods.pods",
            "[{gpus: 1, gpuMilli: 250, weight: 1}]",
        ),
        ("policy.scoring", "fgd"),
        ("server.urlPrefix", "/123"),
        ("annotations.allocation", "a.b/true"),
    ]);
    let cfg = Config::from_sources(None, &[], &flags).unwrap();
    assert_eq!(cfg.policy.typical_pods.pods[0].gpu_milli, 250);
    assert_eq!(cfg.annotations.allocation, "a.b/true");
}

#[test]
fn bad_overrides_name_their_source() {
    let err = Config::from_sources(None, &env(&[("GPU_EXTENDER_POLICY_SCORNG", "x")]), &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("GPU_EXTENDER_POLICY_SCORNG"), "{err}");
    let err = Config::from_sources(
        None,
        &env(&[("GPU_EXTENDER_POLICY_SCORING", "binpak")]),
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("policy.scoring (from env GPU_EXTENDER_POLICY_SCORING)"),
        "{err}"
    );
    assert!(err.contains("unknown policy \"binpak\""), "{err}");
    let flags = set(&[("policy.nope", "1")]);
    let err = Config::from_sources(None, &[], &flags)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("unknown configuration key \"policy.nope\""),
        "{err}"
    );
    let flags = set(&[("bind.reservationTtlSeconds", "soon")]);
    let err = Config::from_sources(None, &[], &flags)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("bind.reservationTtlSeconds (from flag --set bind.reservationTtlSeconds)"),
        "{err}"
    );
    assert!(parse_override("novalue").is_err());
    assert_eq!(
        parse_override("a.b=c=d").unwrap(),
        ("a.b".to_owned(), "c=d".to_owned())
    );
}

#[test]
fn every_key_has_an_env_var_and_exists_in_the_schema() {
    assert_eq!(
        env_var_name("policy.maxPodsPerSharedGpu"),
        "GPU_EXTENDER_POLICY_MAX_PODS_PER_SHARED_GPU"
    );
    assert_eq!(
        env_var_name("nodeLabels.gfdCount"),
        "GPU_EXTENDER_NODE_LABELS_GFD_COUNT"
    );
    let names: BTreeSet<String> = env_vars().into_iter().map(|(v, _)| v).collect();
    assert_eq!(names.len(), KEYS.len(), "env var names are unique");
    // Every key round-trips through an override of its current (default) value, and the
    // documentation mentions every key and variable.
    let docs = include_str!("../../docs/configuration.md");
    let mut cfg = Config::default();
    let tls = Some(TlsConfig {
        cert_file: "/c".into(),
        key_file: "/k".into(),
        client_ca_file: Some("/ca".into()),
        ..TlsConfig::default()
    });
    cfg.server.tls.clone_from(&tls);
    cfg.server.admin_tls.clone_from(&tls);
    cfg.estimator.tls.clone_from(&tls);
    cfg.webhook.tls = tls;
    let tree = serde_yaml_ng::to_value(&cfg).unwrap();
    for key in KEYS {
        let mut node = &tree;
        for segment in key.split('.') {
            node = node
                .get(segment)
                .unwrap_or_else(|| panic!("{key} is not in the schema"));
        }
        let last = key.rsplit('.').next().unwrap();
        assert!(docs.contains(last), "docs/configuration.md misses {key}");
        assert!(
            docs.contains(&env_var_name(key)),
            "docs miss {}",
            env_var_name(key)
        );
    }
    let mut leaves = Vec::new();
    collect_leaves(&tree, String::new(), &mut leaves);
    for leaf in leaves {
        assert!(KEYS.contains(&leaf.as_str()), "KEYS misses {leaf}");
    }
}

fn collect_leaves(value: &Value, path: String, out: &mut Vec<String>) {
    match value {
        Value::Mapping(map) if !path.ends_with("pods") => {
            for (k, v) in map {
                let k = k.as_str().unwrap_or_default();
                let next = if path.is_empty() {
                    k.to_owned()
                } else {
                    format!("{path}.{k}")
                };
                collect_leaves(v, next, out);
            }
        }
        _ => out.push(path),
    }
}

#[test]
fn flags_become_overrides() {
    let flags = ConfigFlags {
        scoring: Some("spread".into()),
        set: vec![
            "policy.scoring=fgd".into(),
            "policy.typicalPods.learn=true".into(),
            "server.allowUnauthenticatedVerbs=true".into(),
        ],
        ..ConfigFlags::default()
    };
    let serve = ServeFlags {
        listen: Some("0.0.0.0:1".into()),
        ..ServeFlags::default()
    };
    let overrides = flags.overrides(serve.overrides()).unwrap();
    let cfg = Config::from_sources(None, &[], &overrides).unwrap();
    assert_eq!(
        cfg.policy.scoring,
        ScoringPolicy::Fgd,
        "--set comes last and wins"
    );
    assert_eq!(cfg.server.listen.port(), 1);
}

#[test]
fn errors_from_shortcut_flags_name_the_flag_typed() {
    let serve = ServeFlags {
        listen: Some("nowhere".into()),
        ..ServeFlags::default()
    };
    let overrides = ConfigFlags::default().overrides(serve.overrides()).unwrap();
    let err = Config::from_sources(None, &[], &overrides)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("server.listen (from flag --listen): "),
        "{err}"
    );
    let serve = ServeFlags {
        gpushare: Some("maybe".into()),
        ..ServeFlags::default()
    };
    let overrides = ConfigFlags::default().overrides(serve.overrides()).unwrap();
    let err = Config::from_sources(None, &[], &overrides)
        .unwrap_err()
        .to_string();
    assert!(err.contains("(from flag --gpushare)"), "{err}");
    let flags = ConfigFlags {
        set: vec!["server.listen=nowhere".into()],
        ..ConfigFlags::default()
    };
    let err = Config::from_sources(None, &[], &flags.overrides(Vec::new()).unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("(from flag --set server.listen)"), "{err}");
}

#[test]
fn a_policy_without_typical_pods_is_named_in_the_error() {
    for policy in ScoringPolicy::ALL.into_iter().filter(|p| p.uses_typical()) {
        let flags = ConfigFlags {
            scoring: Some(policy.as_str().into()),
            ..ConfigFlags::default()
        };
        let err = Config::from_sources(None, &[], &flags.overrides(Vec::new()).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("scoring {} needs typical pods", policy.as_str())),
            "{err}"
        );
    }
}

#[test]
fn name_checks() {
    assert!(is_qualified_name("aliyun.com/gpu-mem"));
    assert!(is_qualified_name("ack.node.gpu.schedule"));
    assert!(is_qualified_name("aliyun.accelerator/nvidia_name"));
    assert!(!is_qualified_name("Bad_Domain/x"));
    assert!(!is_qualified_name("a/"));
    assert!(!is_qualified_name("-x"));
    assert!(is_extended_resource_name("nvidia.com/gpu"));
    assert!(!is_extended_resource_name("gpu"));
    assert!(!is_extended_resource_name("kubernetes.io/gpu"));
}

#[test]
fn verbs_off_loopback_need_client_certificates_or_an_explicit_opt_out() {
    let refused = from_yaml("server: {listen: 0.0.0.0:8888}")
        .unwrap_err()
        .to_string();
    assert!(refused.contains("server.listen"), "{refused}");
    assert!(refused.contains("clientCaFile"), "{refused}");
    assert!(refused.contains("allowUnauthenticatedVerbs"), "{refused}");
    // TLS without client certificates is still anyone's.
    assert!(from_yaml("server: {listen: 0.0.0.0:8888, tls: {certFile: /c, keyFile: /k}}").is_err());
    assert!(
        from_yaml(
            "server: {listen: 0.0.0.0:8888, tls: {certFile: /c, keyFile: /k, clientCaFile: /ca}}"
        )
        .is_ok()
    );
    assert!(from_yaml("server: {listen: 0.0.0.0:8888, allowUnauthenticatedVerbs: true}").is_ok());
    assert!(
        from_yaml("server: {listen: '[::1]:8888'}").is_ok(),
        "loopback"
    );
}

#[test]
fn pinned_client_names_need_a_client_ca_and_must_be_names() {
    let no_ca = from_yaml(
        "server: {adminTls: {certFile: /c, keyFile: /k, allowedClientNames: [kube-scheduler]}}",
    )
    .unwrap_err()
    .to_string();
    assert!(
        no_ca.contains("server.adminTls.allowedClientNames: needs clientCaFile"),
        "{no_ca}"
    );
    let garbage = from_yaml(
        "server: {tls: {certFile: /c, keyFile: /k, clientCaFile: /ca, allowedClientNames: ['not a name']}}",
    )
    .unwrap_err()
    .to_string();
    assert!(
        garbage.contains("neither a DNS name nor an IP address"),
        "{garbage}"
    );
    let cfg = from_yaml(
        "server: {tls: {certFile: /c, keyFile: /k, clientCaFile: /ca, allowedClientNames: [kube-scheduler.gpu-extender.svc, 10.0.0.1]}}",
    )
    .unwrap();
    assert_eq!(
        cfg.server.tls.map(|t| t.allowed_client_names.len()),
        Some(2)
    );
}

#[test]
fn door_limits_are_checked() {
    for (yaml, key) in [
        ("limits: {maxConnections: 0}", "limits.maxConnections"),
        (
            "limits: {headerReadTimeoutMs: 10}",
            "limits.headerReadTimeoutMs",
        ),
        ("limits: {bodyReadTimeoutMs: 0}", "limits.bodyReadTimeoutMs"),
        (
            "limits: {maxBufferedBodyBytes: 1024}",
            "limits.maxBufferedBodyBytes",
        ),
        (
            "limits: {metricsRenderIntervalMs: 3600000}",
            "limits.metricsRenderIntervalMs",
        ),
        (
            "server: {schedulerNames: [Not_A_Name]}",
            "server.schedulerNames",
        ),
        (
            "server: {adminAuth: {audiences: ['']}}",
            "server.adminAuth.audiences",
        ),
    ] {
        let error = from_yaml(yaml).unwrap_err().to_string();
        assert!(error.contains(key), "{yaml}: {error}");
    }
}
