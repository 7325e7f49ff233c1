//! What a tenant may write does not change what the scheduler believes. A ServiceAccount
//! granted what Kubernetes' built-in `edit` role grants on pods in its namespace (create,
//! update, patch, delete; kube-controller-manager, which aggregates `edit`, does not run on the
//! loopback plane, so the Role spells the pod rules out) tries every forgery of the allocation
//! record: a smaller share, its whole GPU moved onto another pod's, the record removed, a
//! record on a pod pinned with `nodeName` that asks for no GPU, and one on a pinned pod naming a
//! GPU another pod holds. Without `deploy/record-policy.yaml` the API server takes them and the
//! extender applies none (`gpu_extender_records_rejected_total`); with it, the API server refuses
//! each, while the extender's own binds go on. The table always equals what the extender bound,
//! and no GPU is held twice.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};

use crate::harness::{Cluster, ROOT, metric_sum, table_holdings};
use crate::objects::{
    GPU_MEM, GpuNode, Mode, NS, NVIDIA_GPU, PodSpec, create_bound, create_pod, pods,
};
use crate::up;

const TENANT: &str = "system:serviceaccount:default:tenant";
const RECORD: &str = "gpu-extender.io/allocation";

/// The tenant's account and what `edit` grants it on pods.
const TENANT_RBAC: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: tenant, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: tenant-edit-pods, namespace: default}
rules:
  - apiGroups: [""]
    resources: [pods]
    verbs: [create, delete, deletecollection, patch, update, get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: tenant-edit-pods, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: tenant-edit-pods}
subjects:
  - {kind: ServiceAccount, name: tenant, namespace: default}
"#;

/// kubectl as the tenant; `Err` carries the API server's refusal.
async fn as_tenant(c: &Cluster, args: &[&str]) -> Result<String> {
    let mut all = vec![
        "--as",
        TENANT,
        "--as-group",
        "system:serviceaccounts",
        "-n",
        NS,
    ];
    all.extend_from_slice(args);
    c.kubectl(&all).await
}

/// The record on `pod`, as JSON.
async fn record_of(c: &Cluster, pod: &str) -> Result<serde_json::Value> {
    let pod = pods(&c.client).get(pod).await?;
    let text = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RECORD))
        .ok_or_else(|| anyhow!("no record"))?;
    Ok(serde_json::from_str(text)?)
}

/// The forgeries, each as the tenant; `refused` says whether the API server must refuse them.
async fn forge_all(
    c: &Cluster,
    records: &BTreeMap<&str, serde_json::Value>,
    round: &str,
    refused: bool,
) -> Result<Vec<String>> {
    let record = |pod: &str| {
        records
            .get(pod)
            .cloned()
            .ok_or_else(|| anyhow!("no record of {pod}"))
    };
    let mut outcomes = Vec::new();
    let mut attempt = |what: &str, result: Result<String>| -> Result<()> {
        match (&result, refused) {
            (Err(error), true) => ensure!(
                format!("{error:#}").contains("written only by gpu-extender"),
                "{what}: refused for another reason: {error:#}"
            ),
            (Ok(_), true) => return Err(anyhow!("{what}: the API server took it")),
            (Err(error), false) => {
                return Err(anyhow!("{what}: refused without the policy: {error:#}"));
            }
            (Ok(_), false) => {}
        }
        outcomes.push(format!(
            "{what}: {}",
            if refused {
                "refused"
            } else {
                "taken by the API server"
            }
        ));
        Ok(())
    };

    // A smaller share on the bound share pod.
    let mut share = record("share")?;
    share["containers"][0]["gpus"][0]["memoryMiB"] = serde_json::json!(1024);
    let result = as_tenant(
        c,
        &[
            "annotate",
            "--overwrite",
            "pod",
            "share",
            &format!("{RECORD}={share}"),
        ],
    )
    .await;
    attempt("a smaller share", result)?;
    // The whole GPU moved onto the one the other whole pod holds.
    let other = record("whole-b")?;
    let mut whole = record("whole-a")?;
    whole["containers"][0]["gpus"] = other["containers"][0]["gpus"].clone();
    let result = as_tenant(
        c,
        &[
            "annotate",
            "--overwrite",
            "pod",
            "whole-a",
            &format!("{RECORD}={whole}"),
        ],
    )
    .await;
    attempt("a whole GPU moved onto another pod's", result)?;
    // The record removed.
    let result = as_tenant(c, &["annotate", "pod", "share", &format!("{RECORD}-")]).await;
    attempt("the record removed", result)?;

    // Pods pinned with nodeName, created by the tenant, then given a record with their UID:
    // one asks no GPU, one asks a GPU and names whole-a's.
    for (name, gpus) in [
        (format!("pinned-none-{round}"), 0),
        (format!("pinned-one-{round}"), 1),
    ] {
        let manifest = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"nodeName": "whole-0", "containers": [{
                "name": "c", "image": "registry.invalid/none:1",
                "resources": {"limits": {NVIDIA_GPU: gpus.to_string()}}}]}
        });
        let file = c.dir.join(format!("{name}.json"));
        std::fs::write(&file, manifest.to_string())?;
        as_tenant(c, &["create", "-f", &file.to_string_lossy()]).await?;
        let uid = pods(&c.client)
            .get(&name)
            .await?
            .metadata
            .uid
            .unwrap_or_default();
        let mut claim = record("whole-a")?;
        claim["podUid"] = serde_json::json!(uid);
        claim["containers"][0]["name"] = serde_json::json!("c");
        let result = as_tenant(c, &["annotate", "pod", &name, &format!("{RECORD}={claim}")]).await;
        attempt(&format!("a record on {name}"), result)?;
    }
    // A pod created with a record already on it.
    let manifest = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("born-with-one-{round}"), "namespace": NS,
                     "annotations": {RECORD: record("whole-a")?.to_string()}},
        "spec": {"nodeName": "whole-0", "containers": [{
            "name": "c", "image": "registry.invalid/none:1",
            "resources": {"limits": {NVIDIA_GPU: "1"}}}]}
    });
    let file = c.dir.join(format!("born-{round}.json"));
    std::fs::write(&file, manifest.to_string())?;
    let result = as_tenant(c, &["create", "-f", &file.to_string_lossy()]).await;
    attempt("a pod created with a record", result)?;
    Ok(outcomes)
}

/// The table holds exactly `expected` for the extender-bound pods, and no whole GPU twice.
async fn check_table(c: &Cluster, expected: &BTreeSet<(String, u16, String)>) -> Result<()> {
    // The watch applies what the API server took within a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = table_holdings(&c.inspect().await?);
    let bound: BTreeSet<_> = held
        .iter()
        .filter(|(_, _, pod)| expected.iter().any(|(_, _, p)| p == pod))
        .cloned()
        .collect();
    ensure!(
        &bound == expected,
        "the table moved: {bound:?}, bound {expected:?}"
    );
    let whole: Vec<_> = held
        .iter()
        .filter(|(node, _, _)| node == "whole-0")
        .collect();
    let gpus: BTreeSet<u16> = whole.iter().map(|(_, gpu, _)| *gpu).collect();
    ensure!(
        gpus.len() == whole.len(),
        "a whole GPU is held twice: {whole:?}"
    );
    Ok(())
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn a_tenant_cannot_rewrite_what_the_scheduler_believes() {
    crate::harness::run("trust", async |c| {
        let nodes = [
            GpuNode::new("whole-0", Mode::Exclusive, 8, "NVIDIA-A100", 40),
            GpuNode::new("share-0", Mode::Share, 2, "Tesla-T4", 16),
        ];
        up(c, &nodes, "").await?;
        let rbac = c.dir.join("tenant.yaml");
        std::fs::write(&rbac, TENANT_RBAC)?;
        c.kubectl(&["apply", "-f", &rbac.to_string_lossy()]).await?;
        for (name, spec) in [
            ("whole-a", PodSpec::new("whole-a", NVIDIA_GPU, 1)),
            ("whole-b", PodSpec::new("whole-b", NVIDIA_GPU, 1)),
            ("share", PodSpec::new("share", GPU_MEM, 8)),
        ] {
            create_bound(&c.client, &spec, Duration::from_secs(60))
                .await
                .with_context(|| format!("binding {name}"))?;
        }
        let expected = table_holdings(&c.inspect().await?);
        ensure!(expected.len() == 3, "bound: {expected:?}");
        let mut records = BTreeMap::new();
        for pod in ["whole-a", "whole-b", "share"] {
            records.insert(pod, record_of(c, pod).await?);
        }

        // Without the policy: the API server takes every forgery, the extender applies none.
        let taken = forge_all(c, &records, "open", false).await?;
        check_table(c, &expected).await?;
        let metrics = c.metrics().await?;
        let rejected = |reason: &str| {
            metric_sum(
                &metrics,
                "gpu_extender_records_rejected_total",
                &[("reason", reason)],
            )
        };
        ensure!(
            rejected("changed") >= 2.0 && rejected("removed") >= 1.0,
            "changes after bind not counted: {}",
            metrics
                .lines()
                .filter(|l| l.contains("records_rejected"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        ensure!(
            rejected("mismatch") >= 1.0 && rejected("conflict") >= 1.0,
            "forged first records not counted: {}",
            metrics
                .lines()
                .filter(|l| l.contains("records_rejected"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        eprintln!("e2e trust: without the policy: {taken:#?}");
        // inspect names each pod whose record was refused, and the pod's owner is told by an
        // Event (sent by the writer replica every 2 s).
        let report = c.inspect().await?;
        let listed: BTreeSet<String> = report["rejectedRecords"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["pod"].as_str().map(str::to_owned))
            .collect();
        for pod in ["share", "whole-a", "pinned-none-open", "pinned-one-open"] {
            ensure!(
                listed.contains(&format!("{NS}/{pod}")),
                "inspect's rejectedRecords miss {pod}: {listed:?}"
            );
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let events = c
                .kubectl(&[
                    "-n",
                    NS,
                    "get",
                    "events",
                    "--field-selector",
                    "reason=AllocationRecordRejected,involvedObject.name=share",
                    "-o",
                    "jsonpath={.items[*].message}",
                ])
                .await?;
            if events.contains("was not applied") {
                break;
            }
            ensure!(
                std::time::Instant::now() < deadline,
                "no AllocationRecordRejected Event on pod share: {events:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }

        // Put the bound pods' records back as they were (the admin may, before the policy), so
        // that each forgery below is a change again.
        for (pod, record) in &records {
            c.kubectl(&[
                "-n",
                NS,
                "annotate",
                "--overwrite",
                "pod",
                pod,
                &format!("{RECORD}={record}"),
            ])
            .await?;
        }
        check_table(c, &expected).await?;

        // With the policy: the API server refuses each; the extender still binds.
        c.kubectl(&["apply", "-f", &format!("{ROOT}/deploy/record-policy.yaml")])
            .await?;
        // A policy takes effect once the API server has compiled it: wait for the first refusal.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        for attempt in 0.. {
            // A value of its own each time: a write of the value already there changes nothing,
            // and the policy lets it through.
            let probe = format!("{RECORD}=probe-{attempt}");
            if as_tenant(c, &["annotate", "--overwrite", "pod", "share", &probe])
                .await
                .is_err()
            {
                break;
            }
            ensure!(
                std::time::Instant::now() < deadline,
                "the policy never took effect"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // The probe's write may have landed before the policy did: put nothing back, the
        // extender keeps the record it applied at bind either way.
        let refused = forge_all(c, &records, "closed", true).await?;
        eprintln!("e2e trust: with the policy: {refused:#?}");
        // Other annotations and labels stay the tenant's to write.
        as_tenant(
            c,
            &[
                "annotate",
                "--overwrite",
                "pod",
                "share",
                "team.example.com/owner=ml",
            ],
        )
        .await?;
        create_pod(&c.client, &PodSpec::new("after-policy", NVIDIA_GPU, 1)).await?;
        crate::objects::wait_bound(&c.client, "after-policy", Duration::from_secs(60)).await?;
        let mut now_expected = expected.clone();
        for holding in table_holdings(&c.inspect().await?) {
            if holding.2 == "after-policy" {
                now_expected.insert(holding);
            }
        }
        check_table(c, &now_expected).await
    });
}
