//! The node agent (`gpu-extender node-agent --backend fake`) publishing real machines' GPUs
//! (tests/fixtures/gpus/) for the extender and kube-scheduler: a topology pod lands on the NVLink
//! island the agent reported intact; GPUs the agent turns unhealthy receive no pods and `explain`
//! says so; a node whose agent stops keeps its last report.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::harness::{Cluster, EXTENDER_BIN, free_port, http_get};
use crate::objects::{
    GpuNode, Mode, NVIDIA_GPU, PodSpec, TOPOLOGY_GPU, create_bound, create_pod, delete_pod,
    wait_unschedulable,
};
use crate::record::record_of;
use crate::{BIND, up};

const NODE_GPUS: &str = "gpu-extender.io/gpus";

/// One agent process, killed on drop.
struct Agent {
    child: Child,
    metrics: std::net::SocketAddr,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A copy of a fixture in the scenario's directory, for the scenario to edit.
fn fixture_copy(c: &Cluster, name: &str) -> Result<PathBuf> {
    let from = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gpus")
        .join(name);
    let to = c.dir.join(name);
    std::fs::copy(&from, &to).with_context(|| format!("copying {}", from.display()))?;
    Ok(to)
}

/// Marks the GPUs at `indices` of a fixture as fallen off the bus.
fn mark_lost(path: &Path, indices: &[usize]) -> Result<()> {
    let text = std::fs::read_to_string(path)?;
    let mut blocks: Vec<String> = text.split("  - uuid:").map(str::to_owned).collect();
    for &index in indices {
        let block = blocks
            .get_mut(index + 1)
            .with_context(|| format!("no GPU {index} in {}", path.display()))?;
        *block = block.replacen("    numa:", "    lost: true\n    numa:", 1);
    }
    // Written whole and renamed, so the agent never reads half a file.
    let next = path.with_extension("next");
    std::fs::write(&next, blocks.join("  - uuid:"))?;
    std::fs::rename(&next, path)?;
    Ok(())
}

fn start_agent(c: &Cluster, node: &str, fixture: &Path) -> Result<Agent> {
    let port = free_port()?;
    let log = std::fs::File::create(c.dir.join(format!("agent-{node}.log")))?;
    let mut command = Command::new(EXTENDER_BIN);
    command
        .args(["node-agent", "--backend=fake", "--interval=1"])
        .arg(format!("--node-name={node}"))
        .arg(format!("--fixture={}", fixture.display()))
        .arg(format!("--metrics-address=127.0.0.1:{port}"))
        .arg(format!("--kubeconfig={}", c.kubeconfig().display()))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("GPU_EXTENDER_") || key == "NODE_NAME" {
            command.env_remove(key);
        }
    }
    Ok(Agent {
        child: command.spawn().context("starting the node agent")?,
        metrics: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
    })
}

/// The health of each GPU of `node` in the extender's own table (`/inspect`).
async fn extender_health(c: &Cluster, node: &str) -> Result<Vec<bool>> {
    let report = c.inspect().await?;
    let nodes = report["nodes"].as_array().context("inspect: no nodes")?;
    let found = nodes
        .iter()
        .find(|n| n["name"] == node)
        .with_context(|| format!("inspect: no node {node}"))?;
    Ok(found["gpus"]
        .as_array()
        .context("inspect: no gpus")?
        .iter()
        .map(|g| g["healthy"] == true)
        .collect())
}

/// Waits until the extender sees `node`'s GPUs with exactly this health.
async fn wait_health(c: &Cluster, node: &str, want: &[bool]) -> Result<()> {
    let deadline = Instant::now() + BIND;
    loop {
        let seen = extender_health(c, node).await?;
        if seen == want {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("node {node}: the extender sees health {seen:?}, expected {want:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn annotation(c: &Cluster, node: &str) -> Result<String> {
    let path = format!(
        "jsonpath={{.metadata.annotations.{}}}",
        NODE_GPUS.replace('.', "\\.")
    );
    c.kubectl(&["get", "node", node, "-o", &path]).await
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn agent_reports_drive_placement_health_and_survive_the_agent() {
    crate::harness::run("node-agent", async |c| {
        let nodes = vec![
            GpuNode::new("dgx1", Mode::Topology, 8, "Tesla-V100-SXM2-32GB", 32),
            GpuNode::new("t4", Mode::Exclusive, 4, "Tesla-T4", 16),
        ];
        up(c, &nodes, "").await?;

        // The DGX-1's GPU 1 fell off the bus: of the two NVLink islands (0-3, 4-7) only the
        // second is intact, and a 4-GPU topology pod must get it.
        let dgx1_fixture = fixture_copy(c, "dgx1-v100.yaml")?;
        mark_lost(&dgx1_fixture, &[1])?;
        let dgx1_agent = start_agent(c, "dgx1", &dgx1_fixture)?;
        let t4_fixture = fixture_copy(c, "t4-pcie.yaml")?;
        let t4_agent = start_agent(c, "t4", &t4_fixture)?;
        wait_health(
            c,
            "dgx1",
            &[true, false, true, true, true, true, true, true],
        )
        .await?;
        wait_health(c, "t4", &[true; 4]).await?;
        let pod = create_bound(
            &c.client,
            &PodSpec::new("allreduce", TOPOLOGY_GPU, 4)
                .annotation("gpu-extender.io/topology", "required"),
            BIND,
        )
        .await?;
        let record = record_of(&pod)?;
        ensure!(record.node == "dgx1", "allreduce went to {}", record.node);
        ensure!(
            record.all_gpus() == [4, 5, 6, 7],
            "allreduce got GPUs {:?}, not the intact island 4-7",
            record.all_gpus()
        );

        // The T4 box serves 2-GPU pods while healthy; then three of its GPUs fail (the fixture
        // changes under the running agent) and it takes no more.
        let pod = create_bound(&c.client, &PodSpec::new("pair-1", NVIDIA_GPU, 2), BIND).await?;
        ensure!(record_of(&pod)?.node == "t4", "pair-1 not on t4");
        delete_pod(&c.client, "pair-1").await?;
        mark_lost(&t4_fixture, &[1, 2, 3])?;
        wait_health(c, "t4", &[true, false, false, false]).await?;
        create_pod(&c.client, &PodSpec::new("pair-2", NVIDIA_GPU, 2)).await?;
        wait_unschedulable(&c.client, "pair-2", BIND).await?;
        let kubeconfig = c.kubeconfig();
        let output = Command::new(EXTENDER_BIN)
            .args(["explain", "default/pair-2", "--kubeconfig"])
            .arg(&kubeconfig)
            .env_remove("GPU_TEST_E2E")
            .env_remove("GPU_TEST_K8S_BIN")
            .output()?;
        let explained = String::from_utf8_lossy(&output.stdout).into_owned();
        let t4_line = explained
            .lines()
            .find(|l| l.starts_with("t4 "))
            .with_context(|| {
                format!(
                    "no t4 line in:\n{explained}\n(explain exited {}: {})",
                    output.status,
                    String::from_utf8_lossy(&output.stderr)
                )
            })?;
        ensure!(
            t4_line.contains("1 of the 4 GPU(s) the pod may use are healthy, it needs 2"),
            "explain for t4: {t4_line}"
        );
        delete_pod(&c.client, "pair-2").await?;
        let pod = create_bound(&c.client, &PodSpec::new("single", NVIDIA_GPU, 1), BIND).await?;
        let record = record_of(&pod)?;
        ensure!(
            record.node == "t4" && record.all_gpus() == [0],
            "single got {} GPUs {:?}, not the healthy GPU 0",
            record.node,
            record.all_gpus()
        );

        // The agent's metric carries the time of its node's report.
        let (status, metrics) = http_get(t4_agent.metrics, "/metrics").await?;
        ensure!(
            status == 200
                && metrics.lines().any(|l| l
                    .starts_with("gpu_extender_agent_last_report_timestamp_seconds{node=\"t4\"} ")
                    && !l.ends_with(" 0")),
            "agent metrics:\n{metrics}"
        );

        // The DGX-1's agent stops; its fixture then changes (GPU 1 back). The node keeps the
        // last report, and the extender the health it had.
        let before = annotation(c, "dgx1").await?;
        drop(dgx1_agent);
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpus/dgx1-v100.yaml"),
            &dgx1_fixture,
        )?;
        // Three of the agent's passes, had it been running.
        tokio::time::sleep(Duration::from_secs(3)).await;
        ensure!(annotation(c, "dgx1").await? == before, "the report changed");
        ensure!(
            extender_health(c, "dgx1").await? == [true, false, true, true, true, true, true, true],
            "the extender's view of dgx1 changed"
        );
        drop(t4_agent);
        Ok(())
    });
}
