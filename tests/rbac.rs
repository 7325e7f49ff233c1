//! The RBAC rules shipped in `deploy/` against the Kubernetes API calls the code in `src/` makes.
//!
//! - The extender's rules (Roles/ClusterRoles labelled `app.kubernetes.io/component: extender`)
//!   must grant exactly the (API group, resource, verb) triples the code needs: a missing one
//!   fails at run time with 403, an extra one is privilege nobody uses. The calls are found by
//!   reading `src/` as Rust syntax (`tests/support/api_calls.rs`, where the mapping from calls to
//!   permissions is documented).
//! - Every other Role, ClusterRole and binding in `deploy/` must be one kube-scheduler needs
//!   (its leader-election Lease, the built-in scheduler roles), bound to the Deployment's
//!   service account, so nothing in `deploy/` grants rights this test does not account for.
//!
//! - docs/install.md's table of the extender's rights must list exactly what those rules grant.
//!
//! No cluster needed: the manifests are read from the files `deploy/kustomization.yaml` lists.
//! `tests/deploy_manifests.rs` asks a real API server the same questions.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a panic is a test failure with its location"
)]

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_yaml_ng::Value;
use support::api_calls::{self, Permission};
use support::manifests::{self, Grant, describe, kind, label, name, namespace};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// The label saying whose rights a Role, ClusterRole or binding carries.
const COMPONENT: &str = "app.kubernetes.io/component";
const EXTENDER: &str = "extender";
const KUBE_SCHEDULER: &str = "kube-scheduler";

/// Built-in roles `deploy/` may bind, each for a reason kube-scheduler has, as
/// `(binding kind, binding namespace, role kind, role name)`.
const BUILT_IN_ROLES: &[(&str, &str, &str, &str)] = &[
    // Everything a scheduler reads and writes (pods, nodes, bindings, events, ...).
    (
        "ClusterRoleBinding",
        "",
        "ClusterRole",
        "system:kube-scheduler",
    ),
    // The VolumeBinding plugin's PV/PVC decisions.
    (
        "ClusterRoleBinding",
        "",
        "ClusterRole",
        "system:volume-scheduler",
    ),
    // Delegated authentication of kube-scheduler's secure port (client CA in kube-system).
    (
        "RoleBinding",
        "kube-system",
        "Role",
        "extension-apiserver-authentication-reader",
    ),
];

fn deploy_dir() -> PathBuf {
    Path::new(ROOT).join("deploy")
}

fn deploy_objects() -> Vec<Value> {
    manifests::kustomization_resources(&deploy_dir())
}

/// The text of a file a `configMapGenerator` of `deploy/kustomization.yaml` puts in a ConfigMap.
fn generated_file(config_map: &str, key: &str) -> String {
    let dir = deploy_dir();
    let text = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
    let kustomization: Value = serde_yaml_ng::from_str(&text).unwrap();
    let generators = kustomization["configMapGenerator"].as_sequence().unwrap();
    let generator = generators
        .iter()
        .find(|g| g["name"].as_str() == Some(config_map))
        .unwrap_or_else(|| panic!("no configMapGenerator {config_map}"));
    let source = manifests::strings(&generator["files"])
        .into_iter()
        .find_map(|f| f.strip_prefix(&format!("{key}=")).map(str::to_owned))
        .unwrap_or_else(|| panic!("configMapGenerator {config_map} has no {key}=FILE"));
    std::fs::read_to_string(dir.join(&source)).unwrap()
}

/// The ServiceAccount the Deployment's pods run as: (namespace, name).
fn service_account(objects: &[Value]) -> (String, String) {
    let deployments: Vec<&Value> = manifests::of_kind(objects, "Deployment").collect();
    let [deployment] = deployments.as_slice() else {
        panic!(
            "expected one Deployment in deploy/, found {}",
            deployments.len()
        );
    };
    let account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .expect("the Deployment names its serviceAccountName");
    (namespace(deployment).to_owned(), account.to_owned())
}

fn rbac_roles(objects: &[Value]) -> impl Iterator<Item = &Value> {
    objects
        .iter()
        .filter(|o| matches!(kind(o), "Role" | "ClusterRole"))
}

#[test]
fn extender_rules_grant_exactly_the_api_calls_the_code_makes() {
    let scan = api_calls::scan_dir(&Path::new(ROOT).join("src"));
    assert!(scan.files > 10, "read only {} files under src/", scan.files);
    assert!(
        scan.problems.is_empty(),
        "calls in src/ that tests/support/api_calls.rs cannot attribute to a permission:\n  {}",
        scan.problems.join("\n  ")
    );
    let needed = scan.permissions();

    let objects = deploy_objects();
    let mut granted = BTreeSet::new();
    for role in rbac_roles(&objects).filter(|r| label(r, COMPONENT) == Some(EXTENDER)) {
        // The writer Lease lives in the extender's own namespace and has a name known in
        // advance (writerLease.name), so its rights are a namespaced Role, named where RBAC
        // can name them (not `create`). Everything else is read or written cluster-wide.
        let grants = manifests::grants(role);
        let lease_only = grants.iter().all(|g| g.permission.resource == "leases");
        if !lease_only {
            assert_eq!(
                kind(role),
                "ClusterRole",
                "{}: the extender lists, watches and binds in every namespace; use a ClusterRole",
                describe(role)
            );
        }
        for Grant {
            permission,
            resource_names,
        } in grants
        {
            assert!(
                resource_names.is_empty()
                    || (permission.resource == "leases"
                        && resource_names == ["gpu-extender-writer"]),
                "{}: resourceNames on {permission}: the code names no objects in advance but the \
                 writer Lease (writerLease.name's default)",
                describe(role)
            );
            granted.insert(permission);
        }
    }

    let missing: Vec<String> = needed
        .difference(&granted)
        .map(|p| format!("{p}, used at:\n      {}", scan.sites(p).join("\n      ")))
        .collect();
    let extra: Vec<String> = granted
        .difference(&needed)
        .map(Permission::to_string)
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "deploy/ RBAC for the extender does not match the code.\n\
         Missing (the API server would answer 403):\n    {}\n\
         Granted but never used by src/:\n    {}\n\
         The code needs: {}",
        if missing.is_empty() {
            "none".to_owned()
        } else {
            missing.join("\n    ")
        },
        if extra.is_empty() {
            "none".to_owned()
        } else {
            extra.join("\n    ")
        },
        needed
            .iter()
            .map(Permission::to_string)
            .collect::<Vec<_>>()
            .join("; "),
    );
}

/// The rows of the extender's RBAC table in docs/install.md (`| API group | resource | verbs |
/// used by |`): every (group, resource, verb) with the names the resource cell limits it to
/// (`` `leases` (`gpu-extender-writer` only) ``). The group `core` is the empty group.
fn documented_grants(install_md: &str) -> Vec<Grant> {
    const HEADER: &str = "| API group | resource | verbs | used by |";
    let mut lines = install_md.lines().skip_while(|l| l.trim() != HEADER);
    assert!(
        lines.next().is_some(),
        "docs/install.md has no table headed {HEADER}"
    );
    let mut grants = Vec::new();
    for row in lines
        .skip_while(|l| l.starts_with("|---"))
        .take_while(|l| l.starts_with('|'))
    {
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        let [group, resource, verbs, ..] = cells.as_slice() else {
            panic!("docs/install.md: a row of the RBAC table without its columns: {row}");
        };
        let group = match *group {
            "core" => "",
            named => named.trim_matches('`'),
        };
        // The backticked words of the resource cell: the resource, then any names it is
        // limited to.
        let ticked: Vec<&str> = resource.split('`').skip(1).step_by(2).collect();
        let [resource, names @ ..] = ticked.as_slice() else {
            panic!("docs/install.md: no `resource` in the RBAC table's row {row}");
        };
        for verb in verbs.split(',').map(str::trim) {
            grants.push(Grant {
                permission: Permission::new(group, resource, verb),
                resource_names: names.iter().map(|n| (*n).to_owned()).collect(),
            });
        }
    }
    assert!(
        !grants.is_empty(),
        "docs/install.md: the RBAC table has no rows"
    );
    grants
}

/// docs/install.md's table of the extender's rights lists exactly what `deploy/` grants it
/// (its ClusterRole and the writer Lease's Role), each with the names it is limited to: a row
/// the manifests do not grant, or a grant the table leaves out, fails.
#[test]
fn the_install_docs_rbac_table_is_what_deploy_grants_the_extender() {
    let docs = std::fs::read_to_string(Path::new(ROOT).join("docs/install.md")).unwrap();
    let key = |g: &Grant| (g.permission.clone(), g.resource_names.clone());
    let documented: BTreeSet<_> = documented_grants(&docs).iter().map(key).collect();
    let objects = deploy_objects();
    let granted: BTreeSet<_> = rbac_roles(&objects)
        .filter(|r| label(r, COMPONENT) == Some(EXTENDER))
        .flat_map(manifests::grants)
        .map(|g| key(&g))
        .collect();
    let show = |set: Vec<&(Permission, Vec<String>)>| -> String {
        let rows: Vec<String> = set
            .iter()
            .map(|(p, names)| match names.as_slice() {
                [] => p.to_string(),
                names => format!("{p} of {}", names.join(", ")),
            })
            .collect();
        if rows.is_empty() {
            "none".to_owned()
        } else {
            rows.join("\n    ")
        }
    };
    assert!(
        documented == granted,
        "docs/install.md's RBAC table against deploy/rbac-extender.yaml.\n\
         In the table, not granted:\n    {}\n\
         Granted, not in the table:\n    {}",
        show(documented.difference(&granted).collect()),
        show(granted.difference(&documented).collect()),
    );
}

/// The table reader on a small table: what it reads, and that it cannot read nothing.
#[test]
fn the_rbac_table_reader_reads_groups_names_and_verbs() {
    let text = "intro\n\n| API group | resource | verbs | used by |\n|---|---|---|---|\n\
                | core | `pods/binding` | create | binds |\n\
                | `coordination.k8s.io` | `leases` (`writer` only) | get, update | the Lease |\n\
                \nafter | not | a | row |\n";
    let rows: Vec<String> = documented_grants(text)
        .iter()
        .map(|g| format!("{} {:?}", g.permission, g.resource_names))
        .collect();
    assert_eq!(
        rows,
        [
            "create pods/binding (core) []",
            "get leases (coordination.k8s.io) [\"writer\"]",
            "update leases (coordination.k8s.io) [\"writer\"]",
        ]
    );
    let missing = std::panic::catch_unwind(|| documented_grants("no table here"));
    assert!(missing.is_err());
}

#[test]
fn every_other_rbac_object_is_one_kube_scheduler_needs() {
    let objects = deploy_objects();
    let (sa_namespace, sa_name) = service_account(&objects);

    // The leader-election Lease kube-scheduler is configured with.
    let scheduler_config: Value =
        serde_yaml_ng::from_str(&generated_file("gpu-scheduler-config", "config.yaml")).unwrap();
    let election = &scheduler_config["leaderElection"];
    let lease_name = election["resourceName"]
        .as_str()
        .expect("leaderElection.resourceName");
    let lease_namespace = election["resourceNamespace"]
        .as_str()
        .expect("leaderElection.resourceNamespace");

    for role in rbac_roles(&objects) {
        match label(role, COMPONENT) {
            Some(EXTENDER) => {} // checked against the code above
            Some(KUBE_SCHEDULER) => {
                assert_eq!(
                    kind(role),
                    "Role",
                    "{}: only the Lease is ours",
                    describe(role)
                );
                assert_eq!(
                    namespace(role),
                    lease_namespace,
                    "{}: not in leaderElection.resourceNamespace",
                    describe(role)
                );
                let lease = |verb: &str, names: &[&str]| Grant {
                    permission: Permission::new("coordination.k8s.io", "leases", verb),
                    resource_names: names.iter().map(|n| (*n).to_owned()).collect(),
                };
                let expected = vec![
                    // create cannot be limited by name: the name is not known when it is checked.
                    lease("create", &[]),
                    lease("get", &[lease_name]),
                    lease("update", &[lease_name]),
                ];
                let mut got = manifests::grants(role);
                got.sort_by(|a, b| a.permission.cmp(&b.permission));
                assert_eq!(
                    got,
                    expected,
                    "{}: leader election needs exactly create, and get/update of the Lease {lease_name}",
                    describe(role)
                );
            }
            other => panic!(
                "{}: label {COMPONENT} is {other:?}; every role in deploy/ must say whose it is \
                 ({EXTENDER} or {KUBE_SCHEDULER}) so this test can check it",
                describe(role)
            ),
        }
    }

    let mut bound = BTreeSet::new();
    for binding in objects
        .iter()
        .filter(|o| matches!(kind(o), "RoleBinding" | "ClusterRoleBinding"))
    {
        let who = describe(binding);
        let subjects = binding["subjects"]
            .as_sequence()
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            subjects.len(),
            1,
            "{who}: exactly one subject, the pod's service account"
        );
        let subject = &subjects[0];
        assert_eq!(
            (
                subject["kind"].as_str(),
                subject["namespace"].as_str(),
                subject["name"].as_str()
            ),
            (
                Some("ServiceAccount"),
                Some(sa_namespace.as_str()),
                Some(sa_name.as_str())
            ),
            "{who}: the subject must be the Deployment's service account"
        );
        let role_kind = binding["roleRef"]["kind"].as_str().unwrap_or_default();
        let role_name = binding["roleRef"]["name"].as_str().unwrap_or_default();
        let ours = rbac_roles(&objects).find(|r| {
            kind(r) == role_kind
                && name(r) == role_name
                && (role_kind == "ClusterRole" || namespace(r) == namespace(binding))
        });
        match ours {
            Some(role) => {
                assert_eq!(
                    label(binding, COMPONENT),
                    label(role, COMPONENT),
                    "{who}: labelled for another component than the role it binds"
                );
                bound.insert(describe(role));
            }
            None => assert!(
                BUILT_IN_ROLES.contains(&(kind(binding), namespace(binding), role_kind, role_name)),
                "{who} binds {role_kind} {role_name}, which is neither defined in deploy/ nor one \
                 of the built-in roles kube-scheduler needs ({BUILT_IN_ROLES:?})"
            ),
        }
    }
    for role in rbac_roles(&objects) {
        assert!(
            bound.contains(&describe(role)),
            "{} is bound to nobody",
            describe(role)
        );
    }
}

#[test]
fn node_agent_rules_grant_exactly_the_api_calls_the_agent_makes() {
    let scan = api_calls::scan_dir(&Path::new(ROOT).join("src/agent"));
    assert!(
        scan.files >= 4,
        "read only {} files under src/agent",
        scan.files
    );
    assert!(scan.problems.is_empty(), "{}", scan.problems.join("\n"));
    let needed = scan.permissions();
    let objects = manifests::kustomization_resources(&deploy_dir().join("node-agent"));
    let mut granted = BTreeSet::new();
    for role in rbac_roles(&objects) {
        assert_eq!(
            label(role, COMPONENT),
            Some("node-agent"),
            "{}",
            describe(role)
        );
        for grant in manifests::grants(role) {
            granted.insert(grant.permission);
        }
    }
    assert_eq!(
        granted
            .iter()
            .map(Permission::to_string)
            .collect::<Vec<_>>(),
        needed.iter().map(Permission::to_string).collect::<Vec<_>>(),
        "deploy/node-agent/rbac.yaml against src/agent"
    );
    // And only to the DaemonSet's service account.
    let daemon_sets: Vec<&Value> = manifests::of_kind(&objects, "DaemonSet").collect();
    let [daemon_set] = daemon_sets.as_slice() else {
        panic!("one DaemonSet expected in deploy/node-agent");
    };
    let account = daemon_set["spec"]["template"]["spec"]["serviceAccountName"].as_str();
    for binding in objects
        .iter()
        .filter(|o| kind(o).ends_with("Binding") && kind(o) != "ValidatingAdmissionPolicyBinding")
    {
        assert_eq!(
            binding["subjects"].as_sequence().map(Vec::len),
            Some(1),
            "{}",
            describe(binding)
        );
        assert_eq!(
            binding["subjects"][0]["name"].as_str(),
            account,
            "{}",
            describe(binding)
        );
        assert_eq!(
            binding["subjects"][0]["namespace"].as_str(),
            Some(namespace(daemon_set))
        );
    }
}

/// The reader of `src/` on small programs: it must find what is there, and refuse to guess.
mod scanner {
    use super::api_calls::{Permission, Scan, scan_sources};

    fn scan(files: &[(&str, &str)]) -> Scan {
        let sources: Vec<(String, String)> = files
            .iter()
            .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
            .collect();
        scan_sources(&sources)
    }

    /// The permissions found, as sorted text.
    fn permissions(scan: &Scan) -> Vec<String> {
        assert!(
            scan.problems.is_empty(),
            "unexpected problems: {:?}",
            scan.problems
        );
        let mut found: Vec<String> = scan
            .permissions()
            .iter()
            .map(Permission::to_string)
            .collect();
        found.sort();
        found
    }

    #[test]
    fn watchers_through_renamed_imports_list_and_watch() {
        let scan = scan(&[(
            "src/watch.rs",
            r#"
            use k8s_openapi::api::core::v1::{Node, Pod};
            use kube::runtime::{watcher as watch_stream, WatchStreamExt};
            use kube::Api;
            pub async fn run(client: kube::Client) {
                let nodes = watch_stream(Api::<Node>::all(client.clone()), Default::default());
                let pods: Api<Pod> = Api::all(client);
                let pods = kube::runtime::watcher(pods, watcher::Config::default().fields("a"));
            }
            "#,
        )]);
        assert_eq!(
            permissions(&scan),
            [
                "list nodes (core)",
                "list pods (core)",
                "watch nodes (core)",
                "watch pods (core)"
            ]
        );
    }

    #[test]
    fn subresources_fields_and_returned_apis_are_followed() {
        let scan = scan(&[
            (
                "src/bind.rs",
                r#"
                use k8s_openapi::api::core::v1::{Binding, Pod};
                use kube::api::{Api, PostParams};
                struct Binder { client: kube::Client, pods: Api<Pod> }
                impl Binder {
                    fn in_ns(&self, ns: &str) -> Api<Pod> { Api::namespaced(self.client.clone(), ns) }
                    async fn bind(&self, b: &Binding) -> kube::Result<()> {
                        self.in_ns("a")
                            .create_subresource::<Binding, serde_json::Value>(
                                "binding", "p", &PostParams::default(), b)
                            .await?;
                        let pods = self.pods.clone();
                        let pods = pods.get_opt("x").await?; // now not an Api
                        pods.iter().count();
                        Ok(())
                    }
                }
                "#,
            ),
            (
                "src/events.rs",
                r#"
                use kube::runtime::events::{Recorder, Reporter};
                fn recorder(client: kube::Client, reporter: Reporter) -> Recorder {
                    Recorder::new(client, reporter)
                }
                "#,
            ),
        ]);
        assert_eq!(
            permissions(&scan),
            [
                "create events (events.k8s.io)",
                "create pods/binding (core)",
                "get pods (core)",
                "patch events (events.k8s.io)"
            ]
        );
    }

    #[test]
    fn requests_built_by_path_are_read_from_their_path() {
        let scan = scan(&[(
            "src/raw.rs",
            r#"
            use kube::core::Request;
            async fn watch(c: kube::Client) {
                let list = Request::new("/api/v1/pods").list(&lp);
                let watch = Request::new("/api/v1/pods").watch(&wp, "1");
            }
            async fn bind(c: kube::Client, ns: &str) {
                let request = kube::core::Request::new(format!("/api/v1/namespaces/{}/pods", ns))
                    .create_subresource("binding", "p", &pp, body);
                let deployments = Request::new(&format!("/apis/apps/v1/namespaces/{ns}/deployments")).get("d", &gp);
            }
            "#,
        )]);
        assert_eq!(
            permissions(&scan),
            [
                "create pods/binding (core)",
                "get deployments (apps)",
                "list pods (core)",
                "watch pods (core)"
            ]
        );
    }

    #[test]
    fn apis_behind_wrappers_are_followed() {
        let scan = scan(&[(
            "src/w.rs",
            r#"
            use std::sync::Arc;
            use k8s_openapi::api::core::v1::Node;
            use kube::Api;
            struct S { nodes: Option<Arc<Api<Node>>> }
            impl S {
                async fn f(&self) { self.nodes.as_ref().unwrap().delete("n", &dp).await; }
            }
            "#,
        )]);
        assert_eq!(permissions(&scan), ["delete nodes (core)"]);
    }

    #[test]
    fn test_code_is_not_shipped() {
        let scan = scan(&[
            (
                "src/k8s/watch.rs",
                r#"
                #[cfg(test)]
                mod tests;
                #[cfg(test)]
                mod inline { fn f(c: kube::Client) { kube::Api::<k8s_openapi::api::core::v1::Pod>::all(c).delete("x"); } }
                "#,
            ),
            (
                "src/k8s/watch/tests.rs",
                "fn f(c: kube::Client) { kube::Api::<k8s_openapi::api::core::v1::Node>::all(c).delete(\"x\"); }",
            ),
        ]);
        assert_eq!(permissions(&scan), Vec::<String>::new());
        assert_eq!(scan.files, 1);
    }

    #[test]
    fn the_two_event_kinds_are_told_apart_by_import() {
        let scan = scan(&[(
            "src/e.rs",
            r#"
            use k8s_openapi::api::core::v1::Event as CoreEvent;
            use k8s_openapi::api::events::v1::Event;
            fn f(c: kube::Client) {
                kube::Api::<CoreEvent>::all(c.clone()).create(&pp, &e);
                kube::Api::<Event>::all(c).patch("n", &pp, &p);
            }
            "#,
        )]);
        assert_eq!(
            permissions(&scan),
            ["create events (core)", "patch events (events.k8s.io)"]
        );
    }

    #[test]
    fn what_cannot_be_attributed_is_a_problem() {
        let cases = [
            // the kind is not written anywhere
            "use kube::{Api, runtime::watcher}; fn f(c: kube::Client) { watcher(Api::all(c), cfg); }",
            // a method the table does not know
            "use kube::Api; use k8s_openapi::api::core::v1::Pod; fn f(a: Api<Pod>) { a.exec(\"p\", cmd, &ap); }",
            // a subresource named by a variable
            "use kube::Api; use k8s_openapi::api::core::v1::Pod; fn f(a: Api<Pod>, s: &str) { a.create_subresource(s, \"p\", &pp, &b); }",
            // a generic kind
            "use kube::Api; fn f<K>(a: Api<K>) { a.list(&lp); }",
            // a kind missing from KINDS
            "use kube::Api; use k8s_openapi::api::core::v1::ServiceAccount; fn f(a: Api<ServiceAccount>) { a.list(&lp); }",
            // an ambiguous bare kind (no import by name)
            "use kube::Api; use k8s_openapi::api::core::v1::*; fn f(a: Api<Event>) { a.create(&pp, &e); }",
            // an Api handed to a function this reader does not follow
            "use kube::Api; use k8s_openapi::api::core::v1::Pod; fn f(c: kube::Client) { g(Api::<Pod>::all(c)); }",
            // a request built on a path this reader cannot see
            "use kube::core::Request; fn f(p: &str) { Request::new(p).list(&lp); }",
            // a request built on an object's path, not a collection's
            "use kube::core::Request; fn f() { Request::new(\"/api/v1/namespaces/a/pods/p\").get(\"x\", &gp); }",
            // a request for a resource missing from KINDS
            "use kube::core::Request; fn f() { Request::new(\"/api/v1/serviceaccounts\").list(&lp); }",
        ];
        for case in cases {
            let scan = scan(&[("src/x.rs", case)]);
            assert!(!scan.problems.is_empty(), "no problem reported for: {case}");
            assert!(scan.uses.is_empty(), "guessed {:?} for: {case}", scan.uses);
        }
    }
}
