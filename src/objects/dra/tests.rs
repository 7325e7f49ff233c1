//! The DRA reader: slices and claims as NVIDIA's driver and kube-scheduler write them, read as GPUs
//! and holds, bad and partial slices said.

#![allow(clippy::unwrap_used, reason = "test fixtures")]

use serde_json::json;

use super::fixtures::{
    claim, claim_pod, gpu, mig, mig_slice, pending_claim, pending_mig_claim, slice,
};
use super::*;

fn cfg() -> DraConfig {
    DraConfig::default()
}

fn pool(node: &str) -> PoolKey {
    PoolKey {
        driver: "gpu.nvidia.com".into(),
        pool: node.into(),
    }
}

fn agent_gpus(uuids: &[&str]) -> Vec<Gpu> {
    uuids
        .iter()
        .enumerate()
        .map(|(index, uuid)| {
            let mut gpu = Gpu::new(index as u16, "A100", MemMiB(81_920));
            gpu.uuid = Some((*uuid).to_owned());
            gpu
        })
        .collect()
}

#[test]
fn gpus_and_mig_slices_are_read_from_a_complete_pool() {
    let mut book = DraBook::new();
    let applied = book.apply_slice(
        &slice(
            "n1-gpus",
            "gpu.nvidia.com",
            "n1",
            1,
            1,
            vec![
                gpu(0, "GPU-a"),
                gpu(1, "GPU-b"),
                mig("gpu-2-mig-0", 2, "GPU-c", 40),
            ],
        ),
        &cfg(),
    );
    assert_eq!(applied.pools, vec![pool("n1")]);
    assert!(applied.problems.is_empty(), "{:?}", applied.problems);
    let devices = book.node_devices("n1");
    assert_eq!(devices.len(), 3);
    let (gpus, problems) = node_gpus(&devices);
    assert!(problems.is_empty());
    let summary: Vec<(u16, bool, u64, Option<&str>)> = gpus
        .iter()
        .map(|g| (g.index.0, g.healthy, g.memory.0, g.uuid.as_deref()))
        .collect();
    // The MIG slice's parent: a card split into slices is never given whole.
    assert_eq!(
        summary,
        vec![
            (0, true, 81_920, Some("GPU-a")),
            (1, true, 81_920, Some("GPU-b")),
            (2, false, 40_960, Some("GPU-c")),
        ]
    );
    assert_eq!(
        gpus[2].model, "NVIDIA A100-SXM4-80GB",
        "qualified attribute name read"
    );
    let counts = book.counts();
    assert_eq!(
        (counts.gpus, counts.mig_slices, counts.pools_complete),
        (2, 1, 1)
    );
}

#[test]
fn a_claims_devices_map_to_gpus_by_uuid_then_by_index() {
    let mut book = DraBook::new();
    book.apply_slice(
        &slice(
            "s",
            "gpu.nvidia.com",
            "n1",
            1,
            1,
            vec![gpu(0, "GPU-a"), gpu(1, "GPU-b")],
        ),
        &cfg(),
    );
    let key = book.apply_claim(&claim("c", &[("n1", "gpu-1")], &["p"]), &cfg());
    assert_eq!(key, "team/c");
    assert_eq!(book.claim_pods(&key), ["team/p".to_owned()]);
    // The node agent reports the GPUs in another order: the UUID decides.
    let reordered = agent_gpus(&["GPU-b", "GPU-a"]);
    let holds = book.claim_holds(&key, |_| Some(&reordered[..]));
    assert_eq!(holds.node.as_deref(), Some("n1"));
    assert!(holds.problems.is_empty(), "{:?}", holds.problems);
    assert_eq!(holds.holds.len(), 1);
    assert_eq!(holds.holds[0].gpu, GpuIndex(0));
    assert!(holds.holds[0].whole);
    // No UUIDs on the node's side: by index.
    let plain = [
        Gpu::new(0, "A100", MemMiB(1)),
        Gpu::new(1, "A100", MemMiB(1)),
    ];
    let holds = book.claim_holds(&key, |_| Some(&plain[..]));
    assert_eq!(holds.holds[0].gpu, GpuIndex(1));
    // A UUID the node does not report: said, not guessed.
    let others = agent_gpus(&["GPU-x", "GPU-y"]);
    let holds = book.claim_holds(&key, |_| Some(&others[..]));
    assert!(holds.holds.is_empty());
    assert!(
        holds.problems[0].contains("GPU-b is not among the GPUs the node reports"),
        "{:?}",
        holds.problems
    );
}

#[test]
fn a_mig_slice_holds_part_of_its_parent() {
    let mut book = DraBook::new();
    book.apply_slice(
        &slice(
            "s",
            "gpu.nvidia.com",
            "n1",
            1,
            1,
            vec![mig("m0", 0, "GPU-a", 40), mig("m1", 0, "GPU-a", 40)],
        ),
        &cfg(),
    );
    let key = book.apply_claim(&claim("c", &[("n1", "m1")], &[]), &cfg());
    let (gpus, _) = node_gpus(&book.node_devices("n1"));
    let holds = book.claim_holds(&key, |_| Some(&gpus[..]));
    assert_eq!(
        holds.holds,
        vec![GpuHold {
            gpu: GpuIndex(0),
            whole: false,
            mem: MemMiB(40_960),
            compute: ComputeMilli(0),
        }]
    );
}

#[test]
fn a_pool_split_across_slices_counts_once_all_have_arrived() {
    let mut book = DraBook::new();
    book.apply_slice(
        &slice("a", "gpu.nvidia.com", "n1", 1, 2, vec![gpu(0, "GPU-a")]),
        &cfg(),
    );
    assert!(book.node_devices("n1").is_empty());
    let problems = book.problems();
    assert!(
        problems
            .iter()
            .any(|p| p.contains("1 of 2 ResourceSlices of generation 1 seen")),
        "{problems:?}"
    );
    let key = book.apply_claim(&claim("c", &[("n1", "gpu-0")], &[]), &cfg());
    let holds = book.claim_holds(&key, |_| None);
    assert!(
        holds.problems[0].contains("waiting for the rest"),
        "{:?}",
        holds.problems
    );
    book.apply_slice(
        &slice("b", "gpu.nvidia.com", "n1", 1, 2, vec![gpu(1, "GPU-b")]),
        &cfg(),
    );
    assert_eq!(book.node_devices("n1").len(), 2);
    assert!(book.problems().is_empty());
}

#[test]
fn only_the_newest_generation_of_a_pool_counts() {
    let mut book = DraBook::new();
    book.apply_slice(
        &slice(
            "old",
            "gpu.nvidia.com",
            "n1",
            1,
            1,
            vec![gpu(0, "GPU-a"), gpu(1, "GPU-b")],
        ),
        &cfg(),
    );
    book.apply_slice(
        &slice("new", "gpu.nvidia.com", "n1", 2, 1, vec![gpu(0, "GPU-a")]),
        &cfg(),
    );
    let devices = book.node_devices("n1");
    assert_eq!(devices.len(), 1, "GPU 1 was in the old generation only");
    let problems = book.problems();
    assert!(
        problems[0].contains("1 slice(s) of an older generation ignored"),
        "{problems:?}"
    );
    assert_eq!(book.counts().stale_slices, 1);
    // The driver deletes the old slice: nothing to say any more.
    assert_eq!(book.remove_slice("old"), vec![pool("n1")]);
    assert!(book.problems().is_empty());
}

#[test]
fn unknown_drivers_and_missing_attributes_are_said_not_guessed() {
    let mut book = DraBook::new();
    let applied = book.apply_slice(
        &slice("other", "tpu.example.com", "n1", 1, 1, vec![gpu(0, "x")]),
        &cfg(),
    );
    assert_eq!(applied.unknown_driver.as_deref(), Some("tpu.example.com"));
    let mut no_memory = gpu(1, "GPU-b");
    no_memory["capacity"] = json!({});
    let mut no_index = gpu(2, "GPU-c");
    no_index["attributes"]
        .as_object_mut()
        .unwrap()
        .remove("index");
    let mut no_type = gpu(3, "GPU-d");
    no_type["attributes"]
        .as_object_mut()
        .unwrap()
        .remove("type");
    let mut nic = gpu(4, "NIC");
    nic["attributes"]["type"] = json!({"string": "nic"});
    let applied = book.apply_slice(
        &slice(
            "s",
            "gpu.nvidia.com",
            "n1",
            1,
            1,
            vec![gpu(0, "GPU-a"), no_memory, no_index, no_type, nic],
        ),
        &cfg(),
    );
    assert_eq!(applied.problems.len(), 3, "{:?}", applied.problems);
    assert!(
        applied.problems[0].contains("device gpu-1: no capacity \"memory\""),
        "{:?}",
        applied.problems
    );
    assert!(applied.problems[1].contains("no int attribute \"index\""));
    assert!(applied.problems[2].contains("no string attribute \"type\""));
    assert_eq!(
        book.node_devices("n1").len(),
        1,
        "only the readable GPU; the NIC is not a GPU"
    );
    let counts = book.counts();
    assert_eq!(
        (counts.unknown_driver_slices, counts.devices_unreadable),
        (1, 3)
    );
    assert!(book.problems()[0].contains("driver tpu.example.com, which dra.drivers does not list"));
    // A claim on another driver's device holds nothing of ours.
    let mut foreign = claim("f", &[("n1", "gpu-0")], &[]);
    foreign
        .status
        .as_mut()
        .unwrap()
        .allocation
        .as_mut()
        .unwrap()
        .devices
        .as_mut()
        .unwrap()
        .results
        .as_mut()
        .unwrap()[0]
        .driver = "tpu.example.com".into();
    book.apply_claim(&foreign, &cfg());
    assert!(book.claim_keys().is_empty());
}

#[test]
fn a_deallocated_or_deleted_claim_is_forgotten() {
    let mut book = DraBook::new();
    book.apply_slice(
        &slice("s", "gpu.nvidia.com", "n1", 1, 1, vec![gpu(0, "GPU-a")]),
        &cfg(),
    );
    let mut c = claim("c", &[("n1", "gpu-0")], &["p"]);
    book.apply_claim(&c, &cfg());
    assert_eq!(book.claims_in(&pool("n1")), vec!["team/c".to_owned()]);
    c.status.as_mut().unwrap().allocation = None;
    book.apply_claim(&c, &cfg());
    assert!(book.claims_in(&pool("n1")).is_empty());
    assert!(book.claim_keys().is_empty());
    book.apply_claim(&claim("d", &[("n1", "gpu-0")], &[]), &cfg());
    book.remove_claim("team/d");
    assert!(book.claims_in(&pool("n1")).is_empty());
}

#[test]
fn holder_keys_name_their_claim() {
    let holder = claim_holder("team/c");
    assert_eq!(holder.as_str(), "dra:team/c");
    assert_eq!(holder_claim(&holder), Some("team/c"));
    assert_eq!(holder_claim(&gpu_engine::HolderKey::new("team/pod")), None);
}

#[test]
fn a_claims_request_counts_whole_gpus_of_known_classes() {
    assert_eq!(
        requested_gpus(&pending_claim("c", "gpu.nvidia.com", 2), &cfg()),
        Some(2)
    );
    assert_eq!(
        requested_gpus(&pending_claim("c", "nic.example.com", 2), &cfg()),
        None
    );
    let mut all = pending_claim("c", "gpu.nvidia.com", 1);
    all.spec
        .devices
        .as_mut()
        .unwrap()
        .requests
        .as_mut()
        .unwrap()[0]
        .exactly
        .as_mut()
        .unwrap()
        .allocation_mode = Some("All".into());
    assert_eq!(
        requested_gpus(&all, &cfg()),
        None,
        "all devices of a class: not read"
    );
    // Kept while pending, and after allocation.
    let mut book = DraBook::new();
    let key = book.apply_claim(&pending_claim("c", "gpu.nvidia.com", 2), &cfg());
    assert_eq!(
        book.claim_request(&key),
        Some(&ClaimAsk {
            gpus: 2,
            mig: Vec::new()
        })
    );
    assert!(book.claim_keys().is_empty(), "holds nothing yet");
    book.remove_claim(&key);
    assert_eq!(book.claim_request(&key), None);
}

#[test]
fn a_pods_claims_are_named_directly_or_by_its_status() {
    assert_eq!(pod_claims(&claim_pod("p", "c")), vec!["team/c".to_owned()]);
    let templated: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "team"},
        "spec": {
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "t"}],
            "containers": [{"name": "c"}],
        },
        "status": {"resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "p-gpus-x1"}]},
    }))
    .unwrap();
    assert_eq!(pod_claims(&templated), vec!["team/p-gpus-x1".to_owned()]);
    let mut not_yet = templated;
    not_yet.status = None;
    assert!(
        pod_claims(&not_yet).is_empty(),
        "the claim is not created yet"
    );
}

/// What the book indexes goes with what it indexes: a slice moved to another node leaves
/// nothing behind on the first, and once every slice and claim is gone the book is empty.
#[test]
fn the_book_keeps_nothing_of_objects_that_are_gone() {
    let mut book = DraBook::new();
    for node in ["n1", "n2", "n3"] {
        book.apply_slice(
            &slice(
                &format!("{node}-a"),
                "gpu.nvidia.com",
                node,
                1,
                2,
                vec![gpu(0, node)],
            ),
            &cfg(),
        );
        book.apply_slice(
            &slice(
                &format!("{node}-b"),
                "gpu.nvidia.com",
                node,
                1,
                2,
                vec![gpu(1, node)],
            ),
            &cfg(),
        );
        book.apply_claim(
            &claim(&format!("c-{node}"), &[(node, "gpu-0")], &["p"]),
            &cfg(),
        );
    }
    book.apply_slice(&slice("x", "tpu.example.com", "n1", 1, 1, vec![]), &cfg());
    // Slice n1-b moves to pool n2 on node n2: n1's pool is left with one of two slices.
    let mut moved = slice("n1-b", "gpu.nvidia.com", "n2", 1, 2, vec![gpu(7, "n2-7")]);
    moved.spec.pool.name = "n2".into();
    book.apply_slice(&moved, &cfg());
    assert!(
        book.node_devices("n1").is_empty(),
        "n1's pool waits for its second slice"
    );
    assert_eq!(book.pools_on("n1"), vec![pool("n1")]);
    let mut names: Vec<String> = ["n1-a", "n1-b", "n2-a", "n2-b", "n3-a", "n3-b", "x"]
        .map(str::to_owned)
        .to_vec();
    names.sort();
    for name in &names {
        book.remove_slice(name);
    }
    for node in ["n1", "n2", "n3"] {
        book.remove_claim(&format!("team/c-{node}"));
    }
    assert!(book.nodes().is_empty());
    assert!(book.claim_keys().is_empty());
    assert_eq!(book.counts(), DraCounts::default());
    assert!(book.claims_in(&pool("n1")).is_empty());
    assert!(book.problems().is_empty());
}

fn profile(text: &str) -> MigProfile {
    MigProfile::parse(text).unwrap()
}

#[test]
fn a_selector_is_read_only_when_it_is_the_plain_profile_comparison() {
    let driver = DraDriverConfig::default();
    let read = |expression: &str| selector_profile(expression, &driver).map(|p| p.to_string());
    for (expression, expected) in [
        (
            "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'",
            "1g.10gb",
        ),
        (
            r#"device.attributes["gpu.nvidia.com"].profile == "3g.40gb""#,
            "3g.40gb",
        ),
        // A YAML block scalar's newline, and whitespace anywhere between the parts.
        (
            "  device . attributes[ 'gpu.nvidia.com' ] .profile=='1g.10gb+me'\n",
            "1g.10gb+me",
        ),
    ] {
        assert_eq!(
            read(expression).as_deref(),
            Some(expected),
            "{expression:?}"
        );
    }
    for expression in [
        // Too complex: the extender does not evaluate CEL.
        "device.attributes['gpu.nvidia.com'].profile == '1g.10gb' && device.attributes['gpu.nvidia.com'].index == 0",
        "device.attributes['gpu.nvidia.com'].profile != '1g.10gb'",
        "device.attributes['gpu.nvidia.com'].profile.startsWith('1g')",
        "'1g.10gb' == device.attributes['gpu.nvidia.com'].profile",
        "device.attributes['gpu.nvidia.com'].profile in ['1g.10gb', '2g.20gb']",
        // Another attribute, domain or variable.
        "device.attributes['gpu.nvidia.com'].type == 'mig'",
        "device.attributes['example.com'].profile == '1g.10gb'",
        "devices.attributes['gpu.nvidia.com'].profile == '1g.10gb'",
        "device.attributes['gpu.nvidia.com'].profiles == '1g.10gb'",
        // Garbage.
        "",
        "device.attributes['gpu.nvidia.com'].profile == ",
        "device.attributes['gpu.nvidia.com'].profile == '1g.10gb",
        "device.attributes['gpu.nvidia.com'].profile == '1g.10gb\"",
        r"device.attributes['gpu.nvidia.com'].profile == '1g\.10gb'",
        "device.attributes['gpu.nvidia.com'].profile == 'large'",
        "))((",
    ] {
        assert_eq!(read(expression), None, "{expression:?}");
    }
    // A profile attribute configured with its domain is compared under that domain.
    let qualified = DraDriverConfig {
        profile_attribute: "mig.example.com/shape".into(),
        ..DraDriverConfig::default()
    };
    assert_eq!(
        selector_profile(
            "device.attributes['mig.example.com'].shape == '2g.20gb'",
            &qualified
        ),
        Some(profile("2g.20gb"))
    );
    assert_eq!(
        selector_profile(
            "device.attributes['gpu.nvidia.com'].profile == '2g.20gb'",
            &qualified
        ),
        None
    );
}

#[test]
fn a_claims_request_asks_mig_slices_by_profile_or_is_said_unread() {
    let one = "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'";
    assert_eq!(
        read_claim_request(&pending_mig_claim("c", "mig.nvidia.com", 3, &[one]), &cfg()),
        Ok(Some(ClaimAsk {
            gpus: 0,
            mig: vec![MigSlices::new(profile("1g.10gb"), 3)],
        }))
    );
    assert_eq!(
        requested_gpus(&pending_mig_claim("c", "mig.nvidia.com", 3, &[one]), &cfg()),
        None,
        "slices are not whole GPUs"
    );
    // A class no driver lists is not the extender's: nothing asked, nothing unread.
    assert_eq!(
        read_claim_request(&pending_mig_claim("c", "mig.example.com", 1, &[]), &cfg()),
        Ok(None)
    );
    for (claim, why) in [
        (
            pending_mig_claim("c", "mig.nvidia.com", 1, &[]),
            "names no profile",
        ),
        (
            pending_mig_claim(
                "c",
                "mig.nvidia.com",
                1,
                &["device.attributes['gpu.nvidia.com'].profile.startsWith('1g')"],
            ),
            "not the plain profile comparison",
        ),
        (
            pending_mig_claim("c", "mig.nvidia.com", 1, &[one, one]),
            "has 2 selectors",
        ),
    ] {
        let error = read_claim_request(&claim, &cfg()).unwrap_err();
        assert!(error.contains(why), "{error}");
        // The book keeps the reason, and no ask.
        let mut book = DraBook::new();
        let key = book.apply_claim(&claim, &cfg());
        assert_eq!(book.claim_request(&key), None);
        assert!(book.claim_unread(&key).unwrap().contains(why));
        book.remove_claim(&key);
        assert_eq!(book.claim_unread(&key), None);
    }
    // Whole GPUs and slices of two requests add up.
    let mut both = pending_mig_claim("c", "mig.nvidia.com", 2, &[one]);
    let gpus = pending_claim("c", "gpu.nvidia.com", 1)
        .spec
        .devices
        .unwrap()
        .requests
        .unwrap();
    both.spec
        .devices
        .as_mut()
        .unwrap()
        .requests
        .as_mut()
        .unwrap()
        .extend(gpus);
    let ask = read_claim_request(&both, &cfg()).unwrap().unwrap();
    assert_eq!(
        (ask.gpus, ask.mig.clone()),
        (1, vec![MigSlices::new(profile("1g.10gb"), 2)])
    );
    assert_eq!(
        ask.describe(),
        "1 whole GPU(s) and 2 MIG slice(s) of 1g.10gb"
    );
}

#[test]
fn a_nodes_mig_slices_become_its_pools_and_a_claim_holds_its_slices() {
    let mut book = DraBook::new();
    let mut devices: Vec<serde_json::Value> = (0..3)
        .map(|i| mig_slice(&format!("gpu-0-mig-{i}"), 0, "GPU-a", "1g.10gb", 10))
        .collect();
    devices.push(mig_slice("gpu-1-mig-0", 1, "GPU-b", "3g.40gb", 40));
    let mut nameless = mig_slice("gpu-1-mig-1", 1, "GPU-b", "3g.40gb", 40);
    nameless["attributes"]
        .as_object_mut()
        .unwrap()
        .remove("profile");
    devices.push(nameless);
    book.apply_slice(
        &slice("n1-gpus", "gpu.nvidia.com", "n1", 1, 1, devices),
        &cfg(),
    );
    let devices = book.node_devices("n1");
    let (pools, problems) = node_mig(&devices);
    assert_eq!(
        pools,
        vec![
            MigSlices::new(profile("1g.10gb"), 3),
            MigSlices::new(profile("3g.40gb"), 1),
        ]
    );
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("gpu-1-mig-1"), "{problems:?}");
    let (gpus, _) = node_gpus(&devices);
    // The claim holds two 1g.10gb slices and the nameless one: its memory, no slice of a profile.
    let key = book.apply_claim(
        &claim(
            "c",
            &[
                ("n1", "gpu-0-mig-0"),
                ("n1", "gpu-0-mig-2"),
                ("n1", "gpu-1-mig-1"),
            ],
            &["p"],
        ),
        &cfg(),
    );
    let holds = book.claim_holds(&key, |_| Some(&gpus[..]));
    assert_eq!(holds.node.as_deref(), Some("n1"));
    assert_eq!(holds.mig, vec![MigSlices::new(profile("1g.10gb"), 2)]);
    let memory: Vec<(u16, u64)> = holds.holds.iter().map(|h| (h.gpu.0, h.mem.0)).collect();
    assert_eq!(memory, vec![(0, 10 << 10), (0, 10 << 10), (1, 40 << 10)]);
    assert_eq!(holds.problems.len(), 1, "{:?}", holds.problems);
    assert!(
        holds.problems[0].contains("names no profile"),
        "{:?}",
        holds.problems
    );
}
