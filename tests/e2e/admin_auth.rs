//! The admin listener's guard (`server.adminAuth`) against a real kube-apiserver: bearer tokens
//! of real ServiceAccounts (TokenRequest API, `kubectl create token`), the shipped
//! `deploy/inspect-reader/clusterrole.yaml` bound to one of them; `/inspect` is 401 without a
//! token, with a forged one or with one issued for another audience, 403 for a user RBAC does
//! not allow, 200 for the reader; the open paths need no token; `inspect --from --token` reads
//! the report; an address whose tokens keep failing is answered 429.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};

use crate::harness::{EXTENDER_BIN, ROOT, http_get_bearer};
use crate::objects::{GpuNode, Mode, create_nodes};

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn inspect_needs_a_token_rbac_allows_and_the_open_paths_need_none() {
    crate::harness::run("admin-auth", async |c| {
        create_nodes(
            &c.client,
            &[GpuNode::new("t4", Mode::Share, 4, "Tesla-T4", 16)],
        )
        .await?;
        // No cache, so that each request below is reviewed by the API server; the default
        // audience (gpu-extender); three refused tokens a minute before 429.
        c.start_extender(
            "server:\n  adminAuth:\n    paths: [/inspect]\n    cacheTtlSeconds: 0\n    \
             failedTokensPerMinute: 3\n",
        )
        .await?;
        let reader_role = Path::new(ROOT).join("deploy/inspect-reader/clusterrole.yaml");
        c.kubectl(&["apply", "-f", &reader_role.to_string_lossy()])
            .await?;
        for account in ["reader", "stranger"] {
            c.kubectl(&["-n", "default", "create", "serviceaccount", account])
                .await?;
        }
        c.kubectl(&[
            "create",
            "clusterrolebinding",
            "reader-inspects",
            "--clusterrole=gpu-extender-inspect-reader",
            "--serviceaccount=default:reader",
        ])
        .await?;
        let token = async |account: &str, audience: Option<&str>| -> Result<String> {
            let mut args = vec!["-n", "default", "create", "token", account];
            if let Some(audience) = audience {
                args.extend(["--audience", audience]);
            }
            Ok(c.kubectl(&args).await?.trim().to_owned())
        };
        let reader = token("reader", Some("gpu-extender")).await?;
        let stranger = token("stranger", Some("gpu-extender")).await?;
        // A token the API server issued for itself: valid, but not for this extender.
        let elsewhere = token("reader", None).await?;
        let admin = c.admin_addr;

        let (status, body) = http_get_bearer(admin, "/inspect", None).await?;
        ensure!(status == 401, "no token: {status} {body}");
        let (status, body) = http_get_bearer(admin, "/inspect", Some("forged.token")).await?;
        ensure!(status == 401, "a forged token: {status} {body}");
        let (status, body) = http_get_bearer(admin, "/inspect", Some(&elsewhere)).await?;
        ensure!(
            status == 401,
            "the reader's token for another audience: {status} {body}"
        );
        let (status, body) = http_get_bearer(admin, "/inspect", Some(&stranger)).await?;
        ensure!(
            status == 403 && body.contains("system:serviceaccount:default:stranger"),
            "a user without the role: {status} {body}"
        );
        let (status, body) = http_get_bearer(admin, "/inspect", Some(&reader)).await?;
        ensure!(status == 200, "the reader: {status} {body}");
        let report: serde_json::Value = serde_json::from_str(&body).context("the report")?;
        ensure!(
            report["nodes"].as_array().is_some_and(|n| n.len() == 1),
            "the reader's report: {body}"
        );
        for open in ["/healthz", "/readyz", "/metrics"] {
            let (status, body) = http_get_bearer(admin, open, None).await?;
            ensure!(status == 200, "{open} without a token: {status} {body}");
        }

        // The CLI: --token, and the same from the environment; without one, the 401 is said.
        let url = format!("http://{admin}");
        let cli = |args: &[&str], env: Option<&str>| -> Result<(bool, String)> {
            let mut command = Command::new(EXTENDER_BIN);
            command.args(args);
            for (key, _) in std::env::vars_os() {
                if key.to_string_lossy().starts_with("GPU_EXTENDER_") {
                    command.env_remove(key);
                }
            }
            if let Some(token) = env {
                command.env("GPU_EXTENDER_ADMIN_TOKEN", token);
            }
            let output = command.output().context("running gpu-extender")?;
            Ok((
                output.status.success(),
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                ),
            ))
        };
        let (ok, out) = cli(&["inspect", "--from", &url, "--token", &reader], None)?;
        ensure!(ok && out.contains("t4"), "inspect --from --token: {out}");
        let (ok, out) = cli(&["inspect", "--from", &url], Some(&reader))?;
        ensure!(
            ok && out.contains("t4"),
            "inspect --from with GPU_EXTENDER_ADMIN_TOKEN: {out}"
        );
        let (ok, out) = cli(&["inspect", "--from", &url], None)?;
        ensure!(
            !ok && out.contains("401"),
            "inspect --from without a token: {out}"
        );

        // Two tokens were refused above; the third refusal uses up the minute's allowance, and
        // then even the reader's good token is answered 429 from this address, unreviewed.
        let (status, body) = http_get_bearer(admin, "/inspect", Some("guess.three")).await?;
        ensure!(status == 401, "the third refused token: {status} {body}");
        let (status, body) = http_get_bearer(admin, "/inspect", Some(&reader)).await?;
        ensure!(
            status == 429 && body.contains("failedTokensPerMinute"),
            "after three refused tokens: {status} {body}"
        );
        let throttled = gpu_test_support::metrics::metric_sum(
            &c.metrics().await?,
            "gpu_extender_admin_tokens_throttled_total",
            &[],
        );
        ensure!(throttled == 1.0, "throttled counted: {throttled}");
        Ok(())
    });
}
