//! The web view (`/ui`) in a real browser: headless Chromium (Debian's `chromium`; `make test`
//! installs it with `scripts/chromium.sh` when missing) loads the page from the extender behind
//! the real control plane, with `/ui/data` guarded by `server.adminAuth` and the token of a
//! ServiceAccount the shipped `deploy/inspect-reader/clusterrole.yaml` allows. What the page
//! draws (every node, every GPU's holders, health and NVLink island, the totals, the pending pod)
//! is checked against `/inspect`; without a token the page asks for one. A screenshot is saved
//! to `$CARGO_TARGET_TMPDIR/web-view.png` (the one docs/operations.md shows came from this run).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};
use serde_json::Value;

use crate::harness::{Cluster, ROOT, http_get_bearer};
use crate::objects::{
    GPU_MEM, GpuNode, Mode, PodSpec, TOPOLOGY_GPU, create_bound, create_nodes, create_pod,
    wait_unschedulable,
};
use crate::record::gpus_annotation;
use crate::{BIND, harness::PROFILE_CONFIG};

/// The browser: `$GPU_TEST_CHROMIUM`, else `chromium` on `PATH`.
fn chromium() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("GPU_TEST_CHROMIUM") {
        return Ok(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("chromium"))
        .find(|candidate| candidate.is_file())
        .context(
            "no chromium on PATH (set GPU_TEST_CHROMIUM, or run scripts/chromium.sh, which \
             installs Debian's chromium package)",
        )
}

/// Chromium headless (its profile in `profile`) on `url` with `args` (`--dump-dom`, `--screenshot=...`); its stdout. The
/// page's first data request is awaited through a virtual-time budget.
fn browse(profile: &Path, url: &str, args: &[&str]) -> Result<String> {
    let output = Command::new(chromium()?)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--hide-scrollbars",
            "--virtual-time-budget=8000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .output()
        .context("running chromium")?;
    ensure!(
        output.status.success(),
        "chromium {args:?} {url} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The web view of `c`'s extender as Chromium draws it (its DOM), with `/ui/data` unguarded;
/// an error when the page never drew its data.
pub(crate) fn drawn_page(c: &Cluster) -> Result<String> {
    let page = format!("http://{}/ui", c.admin_addr);
    let profile = c.dir.join("chromium-profile");
    let dom = tokio::task::block_in_place(|| browse(&profile, &page, &["--dump-dom"]))?;
    ensure!(
        dom.contains("data-ready=\"true\""),
        "the page never drew its data:\n{dom}"
    );
    Ok(dom)
}

/// The HTML of the row `data-node="name"` in the dumped DOM.
pub(crate) fn node_row<'a>(dom: &'a str, name: &str) -> Result<&'a str> {
    let start = dom
        .find(&format!("data-node=\"{name}\""))
        .with_context(|| format!("node {name} is not drawn"))?;
    let rest = &dom[start..];
    let end = rest[1..]
        .find("class=\"node\"")
        .map_or(rest.len(), |end| end + 1);
    Ok(&rest[..end])
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn chromium_draws_what_inspect_reports() {
    crate::harness::run("web-view", async |c| {
        let nodes = vec![
            GpuNode::new("t4x2", Mode::Share, 2, "Tesla-T4", 16),
            // Two NVLink islands of two; GPU 3 unhealthy.
            GpuNode::new("nv4", Mode::Topology, 4, "NVIDIA-A100-SXM4-80GB", 80).annotation(
                "gpu-extender.io/gpus",
                &gpus_annotation(4, 2, "NVIDIA-A100-SXM4-80GB", 81920, &[3]),
            ),
        ];
        create_nodes(&c.client, &nodes).await?;
        c.start_extender(
            "server:\n  adminAuth:\n    paths: [/inspect, /ui/data]\n    cacheTtlSeconds: 0\n",
        )
        .await?;
        c.start_scheduler(PROFILE_CONFIG).await?;
        let reader_role = Path::new(ROOT).join("deploy/inspect-reader/clusterrole.yaml");
        c.kubectl(&["apply", "-f", &reader_role.to_string_lossy()])
            .await?;
        c.kubectl(&["-n", "default", "create", "serviceaccount", "viewer"])
            .await?;
        c.kubectl(&[
            "create",
            "clusterrolebinding",
            "viewer-reads",
            "--clusterrole=gpu-extender-inspect-reader",
            "--serviceaccount=default:viewer",
        ])
        .await?;
        let token = c
            .kubectl(&[
                "-n",
                "default",
                "create",
                "token",
                "viewer",
                "--audience",
                "gpu-extender",
            ])
            .await?
            .trim()
            .to_owned();

        create_bound(&c.client, &PodSpec::new("share-1", GPU_MEM, 10), BIND).await?;
        create_bound(&c.client, &PodSpec::new("share-2", GPU_MEM, 4), BIND).await?;
        create_bound(&c.client, &PodSpec::new("pair-1", TOPOLOGY_GPU, 2), BIND).await?;
        create_pod(&c.client, &PodSpec::new("too-big", GPU_MEM, 30)).await?;
        wait_unschedulable(&c.client, "too-big", BIND).await?;

        let admin = c.admin_addr;
        let (status, body) = http_get_bearer(admin, "/inspect", Some(&token)).await?;
        ensure!(
            status == 200,
            "/inspect with the viewer's token: {status} {body}"
        );
        let inspect: Value = serde_json::from_str(&body).context("decoding /inspect")?;
        let (status, _) = http_get_bearer(admin, "/ui/data", None).await?;
        ensure!(status == 401, "/ui/data without a token: {status}");

        let page = format!("http://{admin}/ui");
        let profile = c.dir.join("chromium-profile");
        let dom = tokio::task::block_in_place(|| {
            browse(&profile, &format!("{page}#token={token}"), &["--dump-dom"])
        })?;
        ensure!(
            dom.contains("data-ready=\"true\""),
            "the page never drew its data:\n{dom}"
        );

        // Every node and GPU of /inspect, with the same holders and health.
        let report_nodes = inspect["nodes"].as_array().context("/inspect nodes")?;
        ensure!(report_nodes.len() == 2, "/inspect: {inspect}");
        for node in report_nodes {
            let name = node["name"].as_str().context("node name")?;
            let row = node_row(&dom, name)?;
            ensure!(
                row.contains(&format!(
                    "data-mode=\"{}\"",
                    node["mode"].as_str().unwrap_or_default()
                )),
                "node {name}: mode not shown:\n{row}"
            );
            for gpu in node["gpus"].as_array().context("gpus")? {
                let pods: Vec<&str> = gpu["pods"]
                    .as_array()
                    .context("pods")?
                    .iter()
                    .filter_map(Value::as_str)
                    .collect();
                let index = &gpu["index"];
                let healthy = gpu["healthy"].as_bool().context("healthy")?;
                let island = if name == "nv4" {
                    (index.as_u64().unwrap_or_default() / 2).to_string()
                } else {
                    String::new()
                };
                let want = format!(
                    "data-gpu=\"{index}\" data-healthy=\"{healthy}\" data-island=\"{island}\" data-pods=\"{}\"",
                    pods.join(" ")
                );
                ensure!(
                    row.contains(&want),
                    "node {name} GPU {index}: expected {want} in\n{row}"
                );
            }
        }
        ensure!(
            node_row(&dom, "nv4")?.contains("class=\"gpu unhealthy"),
            "the unhealthy GPU is not marked"
        );
        ensure!(
            node_row(&dom, "t4x2")?.contains("default/share-1"),
            "share-1's hover text is missing"
        );
        let totals = &inspect["totals"];
        for (key, value) in [("gpus", &totals["gpus"]), ("idle", &totals["idleGpus"])] {
            let want = format!("data-total=\"{key}\"><b>{value}</b>");
            ensure!(dom.contains(&want), "total {key}: expected {want}");
        }
        ensure!(
            dom.contains("data-total=\"unhealthy\"><b>1</b>"),
            "unhealthy total"
        );
        ensure!(
            dom.contains("data-total=\"pending\"><b>1</b>"),
            "pending total"
        );
        let pending = dom
            .split("data-pod=\"default/too-big\"")
            .nth(1)
            .context("the pending pod is not listed")?;
        let pending = &pending[..pending.find("</tr>").unwrap_or(pending.len())];
        ensure!(
            pending.contains("node(s)") && pending.contains("Unschedulable"),
            "the pending pod's reasons (explain's and kube-scheduler's) are not shown: {pending}"
        );

        // Without a token the page asks for one and shows no data.
        let locked = tokio::task::block_in_place(|| browse(&profile, &page, &["--dump-dom"]))?;
        ensure!(
            locked.contains("needs a token") && !locked.contains("data-node="),
            "without a token:\n{locked}"
        );

        let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("web-view.png");
        tokio::task::block_in_place(|| {
            browse(
                &profile,
                &format!("{page}#token={token}"),
                &[
                    "--window-size=1100,620",
                    &format!("--screenshot={}", shot.display()),
                ],
            )
        })?;
        let png = std::fs::read(&shot).context("reading the screenshot")?;
        ensure!(
            png.starts_with(b"\x89PNG") && png.len() > 1000,
            "not a screenshot"
        );
        Ok(())
    });
}
