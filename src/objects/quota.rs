//! `ElasticQuota` objects (scheduler-plugins' `scheduling.x-k8s.io/v1alpha1`) read into engine
//! [`Quota`]s: `spec.min` and `spec.max` as resource lists in the names pods request GPUs by
//! (whole GPUs as a count, GPU memory in GiB, compute in percent of one GPU). `cpu` and
//! `memory` are accepted and not enforced here; any other name makes the quota unreadable, with a
//! message naming it. A quota may cover a group of namespaces, listed in Koordinator's
//! [`GROUP_ANNOTATION`].

use serde_json::Value;

use super::quantity::Quantity;
use crate::config::Config;
use gpu_engine::quota::{Amounts, Quota, QuotaNames, QuotaResource};

/// The `ElasticQuota` annotation listing further namespaces the quota covers, as a JSON array of
/// names (`["team-a-dev", "team-a-ci"]`): Koordinator's, so quotas written for it group the same
/// way here. scheduler-plugins itself has no groups; its quotas carry no such annotation.
pub const GROUP_ANNOTATION: &str = "quota.scheduling.koordinator.sh/namespaces";

/// Resource names an `ElasticQuota` may carry that the extender does not enforce.
pub const NOT_ENFORCED: [&str; 2] = ["cpu", "memory"];

/// The quota resource names of `cfg`: the names pods request GPUs by.
pub fn quota_names(cfg: &Config) -> QuotaNames {
    QuotaNames {
        whole_gpu: cfg.resources.whole_gpu.clone(),
        gpu_mem: cfg.resources.gpu_mem.clone(),
        gpu_core: cfg.resources.gpu_core.clone(),
    }
}

/// Reads one `ElasticQuota` (its name, namespace, `spec` and the [`GROUP_ANNOTATION`]'s value).
/// `Err` says why it is ignored.
pub fn read_quota(
    name: &str,
    namespace: &str,
    spec: Option<&Value>,
    group: Option<&str>,
    cfg: &Config,
) -> Result<Quota, String> {
    let whom = format!("ElasticQuota {namespace}/{name}");
    let also = match group {
        None => Vec::new(),
        Some(text) => read_group(text, namespace).map_err(|problem| {
            format!("{whom}: annotation {GROUP_ANNOTATION} {problem}; quota ignored")
        })?,
    };
    let spec = match spec {
        Some(Value::Object(spec)) => spec,
        None | Some(Value::Null) => return Err(format!("{whom}: no spec; quota ignored")),
        Some(_) => return Err(format!("{whom}: spec is not an object; quota ignored")),
    };
    let names = quota_names(cfg);
    let list = |field: &str| -> Result<[Option<u64>; 3], String> {
        let mut amounts = [None; 3];
        let entries = match spec.get(field) {
            None | Some(Value::Null) => return Ok(amounts),
            Some(Value::Object(entries)) => entries,
            Some(_) => {
                return Err(format!(
                    "{whom}: spec.{field} is not a resource list; quota ignored"
                ));
            }
        };
        for (resource, value) in entries {
            if NOT_ENFORCED.contains(&resource.as_str()) {
                continue;
            }
            let which = if *resource == names.whole_gpu || *resource == cfg.resources.topology_gpu {
                QuotaResource::WholeGpus
            } else if *resource == names.gpu_mem {
                QuotaResource::GpuMemMiB
            } else if *resource == names.gpu_core {
                QuotaResource::GpuComputeMilli
            } else {
                return Err(format!(
                    "{whom}: unknown resource {resource:?} in spec.{field} (the GPU extender counts {}, {} and {}; {} are not enforced); quota ignored",
                    names.whole_gpu,
                    names.gpu_mem,
                    names.gpu_core,
                    NOT_ENFORCED.join(" and ")
                ));
            };
            let text = match value {
                Value::String(text) => text.clone(),
                Value::Number(number) => number.to_string(),
                _ => {
                    return Err(format!(
                        "{whom}: spec.{field}.{resource} is not a quantity; quota ignored"
                    ));
                }
            };
            let bad = |error: &dyn std::fmt::Display| {
                format!("{whom}: spec.{field}.{resource} {text:?} {error}; quota ignored")
            };
            let quantity = Quantity::parse(&text).map_err(|e| bad(&e))?;
            let amount = match which {
                QuotaResource::WholeGpus => quantity.whole(),
                QuotaResource::GpuMemMiB => quantity.floor_scaled(1024, 1),
                QuotaResource::GpuComputeMilli => quantity.floor_scaled(10, 1),
            }
            .map_err(|e| bad(&e))?;
            let slot = &mut amounts[which as usize];
            if slot.is_some() {
                return Err(format!(
                    "{whom}: spec.{field} gives whole GPUs twice ({} and {}); quota ignored",
                    names.whole_gpu, cfg.resources.topology_gpu
                ));
            }
            *slot = Some(amount);
        }
        Ok(amounts)
    };
    let min = list("min")?;
    let max = list("max")?;
    let mut guaranteed = Amounts::default();
    for resource in QuotaResource::ALL {
        guaranteed.set(resource, min[resource as usize].unwrap_or(0));
    }
    Ok(Quota {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        min: guaranteed,
        max,
        also,
    })
}

/// The namespaces a [`GROUP_ANNOTATION`] value lists beside `own`, once each, in its order.
fn read_group(text: &str, own: &str) -> Result<Vec<String>, String> {
    let listed: Vec<String> = serde_json::from_str(text).map_err(|_| {
        format!("{text:?} is not a JSON array of namespace names (like [\"team-a-dev\"])")
    })?;
    let mut also: Vec<String> = Vec::new();
    for namespace in listed {
        if namespace.is_empty() {
            return Err(format!("{text:?} lists an empty namespace name"));
        }
        if namespace != own && !also.contains(&namespace) {
            also.push(namespace);
        }
    }
    Ok(also)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test fixtures")]
    use super::*;
    use serde_json::json;

    fn read(spec: Value) -> Result<Quota, String> {
        read_quota("q", "team-a", Some(&spec), None, &Config::default())
    }

    #[test]
    fn the_group_annotation_lists_further_namespaces() {
        let spec = json!({"max": {"nvidia.com/gpu": 4}});
        let group = r#"["team-a2", "team-a", "team-a3", "team-a2"]"#;
        let quota =
            read_quota("q", "team-a", Some(&spec), Some(group), &Config::default()).unwrap();
        assert_eq!(quota.also, ["team-a2", "team-a3"]);
        assert!(quota.covers("team-a3") && quota.covers("team-a") && !quota.covers("b"));
        let error = read_quota(
            "q",
            "team-a",
            Some(&spec),
            Some("team-a2"),
            &Config::default(),
        )
        .unwrap_err();
        assert_eq!(
            error,
            "ElasticQuota team-a/q: annotation quota.scheduling.koordinator.sh/namespaces \"team-a2\" is not a JSON array of namespace names (like [\"team-a-dev\"]); quota ignored"
        );
        let error = read_quota(
            "q",
            "team-a",
            Some(&spec),
            Some(r#"[""]"#),
            &Config::default(),
        )
        .unwrap_err();
        assert!(error.contains("lists an empty namespace name"), "{error}");
    }

    #[test]
    fn reads_min_and_max_in_request_units() {
        let quota = read(json!({
            "min": {"nvidia.com/gpu": "2", "aliyun.com/gpu-mem": 16, "cpu": "4"},
            "max": {"nvidia.com/gpu": 4, "aliyun.com/gpu-core.percentage": "150"}
        }))
        .unwrap();
        assert_eq!(quota.min.get(QuotaResource::WholeGpus), 2);
        assert_eq!(quota.min.get(QuotaResource::GpuMemMiB), 16 * 1024);
        assert_eq!(quota.max(QuotaResource::WholeGpus), Some(4));
        assert_eq!(quota.max(QuotaResource::GpuComputeMilli), Some(1500));
        assert_eq!(quota.max(QuotaResource::GpuMemMiB), None);
        assert_eq!(quota.namespace, "team-a");
    }

    #[test]
    fn bad_quotas_say_why() {
        let error = read(json!({"max": {"example.com/fpga": 1}})).unwrap_err();
        assert!(error.starts_with("ElasticQuota team-a/q: unknown resource \"example.com/fpga\""));
        assert!(error.ends_with("quota ignored"));
        let error = read(json!({"max": {"nvidia.com/gpu": "1.5"}})).unwrap_err();
        assert!(error.contains("spec.max.nvidia.com/gpu \"1.5\" must be a whole number"));
        let error = read(json!({"min": {"nvidia.com/gpu": "-1"}})).unwrap_err();
        assert!(error.contains("must not be negative"));
        let error = read(json!({"min": {"nvidia.com/gpu": "lots"}})).unwrap_err();
        assert!(error.contains("not a Kubernetes quantity"));
        let error = read(json!({"min": [1]})).unwrap_err();
        assert!(error.contains("spec.min is not a resource list"));
        let error = read(json!({"min": {"nvidia.com/gpu": 1, "aliyun.com/gpu": 1}})).unwrap_err();
        assert!(error.contains("whole GPUs twice"));
        let error = read_quota("q", "ns", None, None, &Config::default()).unwrap_err();
        assert_eq!(error, "ElasticQuota ns/q: no spec; quota ignored");
    }
}
