//! The checks types cannot express: ranges, names, and consistency between keys, each problem
//! reported with its key.

use std::collections::BTreeSet;

use gpu_engine::ModelPattern;

use super::{
    ADMIN_PATHS, Config, ConfigError, is_dns_label, is_dns_subdomain, is_extended_resource_name,
    is_qualified_name,
};

impl Config {
    /// Checks what types cannot: ranges, names, and consistency between keys. Every problem is
    /// reported, each prefixed with its key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        let mut check = |ok: bool, key: &str, message: String| {
            if !ok {
                problems.push(format!("{key}: {message}"));
            }
        };

        for (old, new) in self.policy.renamed_conflicts() {
            check(
                false,
                old,
                format!("is the old name of {new}, which is set to another value: set only {new}"),
            );
        }

        let mut driver_names = BTreeSet::new();
        for (i, driver) in self.dra.drivers.iter().enumerate() {
            let key = format!("dra.drivers[{i}]");
            check(
                !driver.name.trim().is_empty(),
                &key,
                "name must name the driver (spec.driver of its ResourceSlices)".into(),
            );
            check(
                driver_names.insert(driver.name.as_str()),
                &key,
                format!("driver {:?} is listed twice", driver.name),
            );
            check(
                driver.gpu_type != driver.mig_type,
                &key,
                "gpuType and migType must differ".into(),
            );
            for class in &driver.mig_device_classes {
                check(
                    !driver.device_classes.contains(class),
                    &key,
                    format!(
                        "DeviceClass {class:?} is listed both in deviceClasses and migDeviceClasses"
                    ),
                );
            }
            for (field, value) in [
                ("typeAttribute", &driver.type_attribute),
                ("uuidAttribute", &driver.uuid_attribute),
                ("indexAttribute", &driver.index_attribute),
                ("parentUuidAttribute", &driver.parent_uuid_attribute),
                ("parentIndexAttribute", &driver.parent_index_attribute),
                ("modelAttribute", &driver.model_attribute),
                ("profileAttribute", &driver.profile_attribute),
                ("memoryCapacity", &driver.memory_capacity),
            ] {
                check(
                    !value.trim().is_empty(),
                    &format!("{key}.{field}"),
                    "must not be empty".into(),
                );
            }
        }

        let r = &self.resources;
        for (key, name) in [
            ("resources.wholeGpu", &r.whole_gpu),
            ("resources.gpuMem", &r.gpu_mem),
            ("resources.gpuCore", &r.gpu_core),
            ("resources.topologyGpu", &r.topology_gpu),
        ] {
            check(
                is_extended_resource_name(name),
                key,
                format!("{name:?} is not an extended resource name (like example.com/gpu)"),
            );
        }
        check(
            distinct(&[&r.whole_gpu, &r.gpu_mem, &r.gpu_core, &r.topology_gpu]),
            "resources",
            "wholeGpu, gpuMem, gpuCore and topologyGpu must be different resources".into(),
        );
        check(
            (1..=100).contains(&r.gpu_core_percent_step),
            "resources.gpuCorePercentStep",
            format!("{} is out of range 1..=100", r.gpu_core_percent_step),
        );
        let l = &self.node_labels;
        for (key, name) in [
            ("resources.gpuCount", &r.gpu_count),
            ("nodeLabels.mode", &l.mode),
            ("nodeLabels.placement", &l.placement),
            ("nodeLabels.model", &l.model),
            ("nodeLabels.memory", &l.memory),
            ("nodeLabels.count", &l.count),
            ("nodeLabels.gfdProduct", &l.gfd_product),
            ("nodeLabels.gfdMemory", &l.gfd_memory),
            ("nodeLabels.gfdCount", &l.gfd_count),
        ] {
            check(
                is_qualified_name(name),
                key,
                format!("{name:?} is not a valid label key"),
            );
        }
        let a = &self.annotations;
        let annotation_keys = [
            ("annotations.allocation", &a.allocation),
            ("annotations.nodeGpus", &a.node_gpus),
            ("annotations.modelInclude", &a.model_include),
            ("annotations.modelExclude", &a.model_exclude),
            ("annotations.minGpuMemory", &a.min_gpu_memory),
            ("annotations.placement", &a.placement),
            ("annotations.topology", &a.topology),
            ("annotations.requeue", &a.requeue),
        ];
        for (key, name) in annotation_keys {
            check(
                is_qualified_name(name),
                key,
                format!("{name:?} is not a valid annotation key"),
            );
        }
        check(
            distinct(&annotation_keys.map(|(_, name)| name.as_str())),
            "annotations",
            "every annotation key must be different".into(),
        );

        let p = &self.policy;
        check(
            (1..=1000).contains(&p.max_pods_per_shared_gpu),
            "policy.maxPodsPerSharedGpu",
            format!("{} is out of range 1..=1000", p.max_pods_per_shared_gpu),
        );
        check(
            !p.scoring.uses_typical() || p.typical_pods.learn || !p.typical_pods.pods.is_empty(),
            "policy.typicalPods",
            format!(
                "scoring {} needs typical pods: list them under pods, or set learn: true",
                p.scoring.as_str()
            ),
        );
        for (i, pod) in p.typical_pods.pods.iter().enumerate() {
            let key = format!("policy.typicalPods.pods[{i}]");
            check(
                pod.weight.is_finite() && pod.weight > 0.0,
                &key,
                format!("weight {} must be a positive number", pod.weight),
            );
            check(
                pod.gpu_milli <= 1000,
                &key,
                format!("gpuMilli {} is more than a whole GPU (1000)", pod.gpu_milli),
            );
            check(
                (pod.gpus == 0) == (pod.gpu_milli == 0),
                &key,
                "gpus and gpuMilli must both be 0 (a CPU-only pod) or both positive".into(),
            );
            check(
                pod.gpus <= 64,
                &key,
                format!("gpus {} is more than a node can have (64)", pod.gpus),
            );
            for model in &pod.models {
                if let Err(e) = ModelPattern::parse(model) {
                    check(false, &key, e.to_string());
                }
            }
        }

        let s = &self.server;
        check(
            s.url_prefix.starts_with('/') && !s.url_prefix.contains(['?', '#', ' ']),
            "server.urlPrefix",
            format!("{:?} must be a path starting with '/'", s.url_prefix),
        );
        check(
            s.listen != s.admin_listen,
            "server.adminListen",
            "must differ from server.listen".into(),
        );
        check(
            s.body_limit_bytes >= 64 * 1024,
            "server.bodyLimitBytes",
            format!("{} is too small (at least 65536)", s.body_limit_bytes),
        );
        check(
            (1..=600_000).contains(&s.request_timeout_ms),
            "server.requestTimeoutMs",
            format!("{} is out of range 1..=600000", s.request_timeout_ms),
        );
        check(
            s.listen.ip().is_loopback()
                || s.allow_unauthenticated_verbs
                || s.tls.as_ref().is_some_and(|t| t.client_ca_file.is_some()),
            "server.listen",
            format!(
                "{} is off loopback, so anyone who reaches it could bind pods: serve it with \
                 server.tls and server.tls.clientCaFile (kube-scheduler then presents a client \
                 certificate), or set server.allowUnauthenticatedVerbs: true where something \
                 else guards the port",
                s.listen
            ),
        );
        for name in &s.scheduler_names {
            check(
                is_dns_subdomain(name),
                "server.schedulerNames",
                format!("{name:?} is not a scheduler name (a DNS-1123 subdomain)"),
            );
        }
        for audience in &s.admin_auth.audiences {
            check(
                !audience.trim().is_empty(),
                "server.adminAuth.audiences",
                "an audience must not be empty".into(),
            );
        }
        check(
            s.admin_auth.failed_tokens_per_minute <= 10_000,
            "server.adminAuth.failedTokensPerMinute",
            format!(
                "{} is out of range 0..=10000",
                s.admin_auth.failed_tokens_per_minute
            ),
        );
        for (section, tls) in [
            ("server.tls", &s.tls),
            ("server.adminTls", &s.admin_tls),
            ("estimator.tls", &self.estimator.tls),
            ("webhook.tls", &self.webhook.tls),
        ] {
            let Some(tls) = tls else { continue };
            check(
                !tls.cert_file.as_os_str().is_empty(),
                &format!("{section}.certFile"),
                "must not be empty".into(),
            );
            check(
                !tls.key_file.as_os_str().is_empty(),
                &format!("{section}.keyFile"),
                "must not be empty".into(),
            );
            check(
                tls.client_ca_file
                    .as_ref()
                    .is_none_or(|f| !f.as_os_str().is_empty()),
                &format!("{section}.clientCaFile"),
                "must not be empty (leave it out for no client certificates)".into(),
            );
            check(
                (1..=3600).contains(&tls.reload_interval_seconds),
                &format!("{section}.reloadIntervalSeconds"),
                format!("{} is out of range 1..=3600", tls.reload_interval_seconds),
            );
            check(
                tls.allowed_client_names.is_empty() || tls.client_ca_file.is_some(),
                &format!("{section}.allowedClientNames"),
                "needs clientCaFile: without it clients present no certificate to check".into(),
            );
            for name in &tls.allowed_client_names {
                check(
                    rustls::pki_types::ServerName::try_from(name.as_str()).is_ok(),
                    &format!("{section}.allowedClientNames"),
                    format!("{name:?} is neither a DNS name nor an IP address"),
                );
            }
        }
        let e = &self.estimator;
        if let Some(listen) = e.listen {
            let authenticated = e
                .tls
                .as_ref()
                .is_some_and(|tls| tls.client_ca_file.is_some());
            check(
                listen.ip().to_canonical().is_loopback()
                    || authenticated
                    || e.allow_unauthenticated,
                "estimator.listen",
                format!(
                    "{listen} is not a loopback address, so callers must present a client \
                     certificate: set estimator.tls.certFile, estimator.tls.keyFile and \
                     estimator.tls.clientCaFile (the CA of karmada-scheduler's \
                     --scheduler-estimator-cert-file), or set estimator.allowUnauthenticated: \
                     true where something in front of the estimator authenticates its callers"
                ),
            );
        }
        check(
            (1..=1024).contains(&e.max_concurrent_requests),
            "estimator.maxConcurrentRequests",
            format!("{} is out of range 1..=1024", e.max_concurrent_requests),
        );
        check(
            self.webhook.listen.is_none() || self.webhook.tls.is_some(),
            "webhook.tls",
            "is needed with webhook.listen: kube-apiserver calls admission webhooks over HTTPS only"
                .into(),
        );
        for path in &s.admin_auth.paths {
            check(
                ADMIN_PATHS.contains(&path.as_str()),
                "server.adminAuth.paths",
                format!(
                    "{path:?} is not an admin path (one of {})",
                    ADMIN_PATHS.join(", ")
                ),
            );
        }
        check(
            s.admin_auth.cache_ttl_seconds <= 300,
            "server.adminAuth.cacheTtlSeconds",
            format!("{} is out of range 0..=300", s.admin_auth.cache_ttl_seconds),
        );
        check(
            (1..=86_400).contains(&self.bind.reservation_ttl_seconds),
            "bind.reservationTtlSeconds",
            format!(
                "{} is out of range 1..=86400",
                self.bind.reservation_ttl_seconds
            ),
        );
        check(
            (1..=1000).contains(&self.requeue.max_pods_per_node),
            "requeue.maxPodsPerNode",
            format!(
                "{} is out of range 1..=1000",
                self.requeue.max_pods_per_node
            ),
        );
        check(
            (1..=3600).contains(&self.policy.typical_pods.learn_interval_seconds),
            "policy.typicalPods.learnIntervalSeconds",
            format!(
                "{} is out of range 1..=3600",
                self.policy.typical_pods.learn_interval_seconds
            ),
        );
        check(
            (1..=3600).contains(&self.requeue.min_interval_seconds),
            "requeue.minIntervalSeconds",
            format!(
                "{} is out of range 1..=3600",
                self.requeue.min_interval_seconds
            ),
        );
        check(
            (3..=300).contains(&self.writer_lease.duration_seconds),
            "writerLease.durationSeconds",
            format!(
                "{} is out of range 3..=300",
                self.writer_lease.duration_seconds
            ),
        );
        check(
            is_dns_label(&self.writer_lease.name),
            "writerLease.name",
            format!("{:?} is not a DNS-1123 name", self.writer_lease.name),
        );
        check(
            self.writer_lease.namespace.is_empty() || is_dns_label(&self.writer_lease.namespace),
            "writerLease.namespace",
            format!("{:?} is not a namespace name", self.writer_lease.namespace),
        );
        check(
            (1..=3600).contains(&self.quota.reclaim.interval_seconds),
            "quota.reclaim.intervalSeconds",
            format!(
                "{} is out of range 1..=3600",
                self.quota.reclaim.interval_seconds
            ),
        );
        check(
            (1..=86400).contains(&self.quota.reclaim.cool_down_seconds),
            "quota.reclaim.coolDownSeconds",
            format!(
                "{} is out of range 1..=86400",
                self.quota.reclaim.cool_down_seconds
            ),
        );
        check(
            (1..=1024).contains(&self.limits.max_concurrent_admin_requests),
            "limits.maxConcurrentAdminRequests",
            format!(
                "{} is out of range 1..=1024",
                self.limits.max_concurrent_admin_requests
            ),
        );
        check(
            self.limits.max_concurrent_requests >= 1,
            "limits.maxConcurrentRequests",
            "must be at least 1".into(),
        );
        let limits = &self.limits;
        check(
            (1..=65_536).contains(&limits.max_connections),
            "limits.maxConnections",
            format!("{} is out of range 1..=65536", limits.max_connections),
        );
        for (key, millis) in [
            ("limits.headerReadTimeoutMs", limits.header_read_timeout_ms),
            ("limits.bodyReadTimeoutMs", limits.body_read_timeout_ms),
        ] {
            check(
                (100..=600_000).contains(&millis),
                key,
                format!("{millis} is out of range 100..=600000"),
            );
        }
        check(
            limits.max_buffered_body_bytes >= s.body_limit_bytes,
            "limits.maxBufferedBodyBytes",
            format!(
                "{} is below server.bodyLimitBytes ({}): the largest body could never be read",
                limits.max_buffered_body_bytes, s.body_limit_bytes
            ),
        );
        check(
            limits.metrics_render_interval_ms <= 600_000,
            "limits.metricsRenderIntervalMs",
            format!(
                "{} is out of range 0..=600000",
                limits.metrics_render_interval_ms
            ),
        );

        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }
}

fn distinct(names: &[&str]) -> bool {
    names.iter().collect::<BTreeSet<_>>().len() == names.len()
}
