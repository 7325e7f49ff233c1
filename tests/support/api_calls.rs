//! Which Kubernetes API calls the code in `src/` makes, read from the source as Rust syntax (syn),
//! and the RBAC permission each one needs. Used by `tests/rbac.rs` (the rules in `deploy/` must be
//! exactly these) and `tests/deploy_manifests.rs` (the API server must grant each of them).
//!
//! # From code to permissions
//!
//! | in `src/` (outside `#[cfg(test)]`) | RBAC verb on (API group, resource) |
//! |---|---|
//! | `Api<K>` value `.get(..)`, `.get_opt`, `.get_metadata*` | `get` on K's resource |
//! | `.list(..)`, `.list_metadata` | `list` |
//! | `.watch(..)`, `.watch_metadata` | `watch` |
//! | `.create(..)` / `.patch(..)`, `.patch_metadata` / `.replace(..)` | `create` / `patch` / `update` |
//! | `.delete(..)` / `.delete_collection(..)` | `delete` / `deletecollection` |
//! | `.get_status` / `.patch_status` / `.replace_status` | `get` / `patch` / `update` on `K/status` |
//! | `.get_scale` / `.patch_scale` / `.replace_scale` | the same on `K/scale` |
//! | `.get_subresource("s", ..)` / `.create_subresource("s", ..)` / `.patch_subresource` / `.replace_subresource` | `get` / `create` / `patch` / `update` on `K/s` (the name must be a string literal) |
//! | `.evict(..)` | `create` on `pods/eviction` |
//! | `.logs(..)`, `.log_stream(..)` | `get` on `pods/log` |
//! | `.entry(..)` | `get`, `create`, `update` (commit creates or replaces) |
//! | kube-runtime `watcher(api, ..)`, `metadata_watcher`, `watch_object`, `wait::await_condition`, `Controller::new(api, ..)`, `.owns(api, ..)`, `.watches(api, ..)` | `list` and `watch` on the api's resource |
//! | kube's `Request::new(path)` followed by one of the methods above (`.list(..)`, `.watch(..)`, `.create_subresource("binding", ..)`, ...) | the same verbs on the resource `path` names (`/api/v1/[namespaces/{}/]pods`, `/apis/<group>/<version>/...`; a string literal or `format!`) |
//! | kube-runtime `events::Recorder::new(..)` | `create` and `patch` on `events` in `events.k8s.io` (`Recorder::publish` creates an event, then patches it to count repeats) |
//!
//! K's API group and resource name come from k8s-openapi (`Resource::GROUP`,
//! `Resource::URL_PATH_SEGMENT`) for the kinds listed in [`KINDS`]; kube's `DynamicObject` is
//! read as scheduler-plugins' `ElasticQuota`, the only dynamic kind the code uses.
//!
//! # How an `Api<K>` value is recognised
//!
//! An expression is an `Api<K>` when it is `Api::<K>::all(..)` / `::namespaced(..)` / any other
//! constructor with the kind written out; a local variable or function parameter declared
//! `Api<K>` (or `&Api<K>`), or initialised from such an expression; a struct field declared
//! `Api<K>`; a call of a function or method of this crate declared to return `Api<K>`; or
//! `.clone()`, `.as_ref()`, `.unwrap()`, `.lock()` (and the like), `&`, `?`, `.await` or
//! parentheses around one of these. `Option`, `Arc`, `Box`, `Mutex`, ... around `Api<K>` are read
//! through. Names are resolved through the file's `use` items, so
//! `use kube::runtime::watcher as watch_stream;` is still a watcher.
//!
//! Whatever this reading cannot settle is reported as a problem rather than guessed: an `Api`
//! constructor whose kind is not written (`Api::all(client)` passed straight to a function), an
//! `Api` made and then handed somewhere this reading does not follow (its calls would be missed), a
//! method on an `Api` value that the table above does not know, a kind missing from [`KINDS`],
//! a generic kind, a subresource named by a variable. The fix is to write the kind or the literal
//! out (or extend the table here), so the list of calls stays complete.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::visit::{self, Visit};

/// What RBAC authorizes: a verb on a resource (with its subresource, `pods/binding`) of an API
/// group (`""` is the core group).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Permission {
    pub group: String,
    pub resource: String,
    pub verb: String,
}

impl Permission {
    pub fn new(group: &str, resource: &str, verb: &str) -> Self {
        Self {
            group: group.to_owned(),
            resource: resource.to_owned(),
            verb: verb.to_owned(),
        }
    }

    /// The resource as `kubectl auth can-i` takes it: `pods`, `events.events.k8s.io`.
    pub fn kubectl_resource(&self) -> String {
        let (resource, _) = self.split_subresource();
        if self.group.is_empty() {
            resource.to_owned()
        } else {
            format!("{resource}.{}", self.group)
        }
    }

    /// `("pods", Some("binding"))` for `pods/binding`.
    pub fn split_subresource(&self) -> (&str, Option<&str>) {
        match self.resource.split_once('/') {
            Some((resource, sub)) => (resource, Some(sub)),
            None => (&self.resource, None),
        }
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(f, "{} {} ({group})", self.verb, self.resource)
    }
}

/// One call in the code and the permission it needs.
#[derive(Clone, Debug)]
pub struct ApiUse {
    pub permission: Permission,
    /// `src/k8s/watch.rs:764`
    pub site: String,
    /// What was seen: `watcher(Api<core::v1::Node>)`.
    pub call: String,
}

/// The result of reading the sources.
#[derive(Debug, Default)]
pub struct Scan {
    pub uses: Vec<ApiUse>,
    /// Calls that could not be attributed; each is a test failure.
    pub problems: Vec<String>,
    /// The files read.
    pub files: usize,
}

impl Scan {
    pub fn permissions(&self) -> BTreeSet<Permission> {
        self.uses.iter().map(|u| u.permission.clone()).collect()
    }

    /// Where each permission is used, for messages.
    pub fn sites(&self, permission: &Permission) -> Vec<String> {
        self.uses
            .iter()
            .filter(|u| &u.permission == permission)
            .map(|u| format!("{} {}", u.site, u.call))
            .collect()
    }
}

/// The kinds the code may hold an `Api` of, keyed by their path under `k8s_openapi::api`. Group
/// and resource name come from k8s-openapi itself.
macro_rules! kinds {
    ($($group:ident :: $version:ident :: $kind:ident),* $(,)?; $(($key:expr, $g:expr, $r:expr)),* $(,)?) => {
        &[$((
            concat!(stringify!($group), "::", stringify!($version), "::", stringify!($kind)),
            <k8s_openapi::api::$group::$version::$kind as k8s_openapi::Resource>::GROUP,
            <k8s_openapi::api::$group::$version::$kind as k8s_openapi::Resource>::URL_PATH_SEGMENT,
        )),* $(,($key, $g, $r))*]
    };
}

/// `(path under k8s_openapi::api, API group, resource)`.
pub const KINDS: &[(&str, &str, &str)] = kinds![
    core::v1::Node,
    core::v1::Pod,
    core::v1::Event,
    core::v1::ConfigMap,
    core::v1::Namespace,
    core::v1::Secret,
    core::v1::Service,
    core::v1::PersistentVolumeClaim,
    events::v1::Event,
    coordination::v1::Lease,
    apps::v1::Deployment,
    apps::v1::DaemonSet,
    apps::v1::ReplicaSet,
    apps::v1::StatefulSet,
    batch::v1::Job,
    policy::v1::PodDisruptionBudget,
    scheduling::v1::PriorityClass,
    authentication::v1::TokenReview,
    authorization::v1::SubjectAccessReview,
    resource::v1::ResourceSlice,
    resource::v1::ResourceClaim;
    // kube's `DynamicObject`: the only dynamic kind the code holds an `Api` of is scheduler-plugins'
    // `ElasticQuota` (src/k8s/quota.rs).
    (DYNAMIC_OBJECT, "scheduling.x-k8s.io", "elasticquotas"),
];

/// The [`KINDS`] key of `kube::api::DynamicObject`, read as `ElasticQuota`.
const DYNAMIC_OBJECT: &str = "DynamicObject";

/// What a method of `Api<K>` asks the API server for.
enum Method {
    /// These verbs on K's resource, or on K's fixed subresource.
    Verbs(&'static [&'static str], Option<&'static str>),
    /// This verb on the subresource named by the first argument (a string literal).
    Subresource(&'static str),
    /// No request (`clone`, `resource_url`, ...).
    Local,
}

fn api_method(name: &str) -> Option<Method> {
    use Method::*;
    Some(match name {
        "get"
        | "get_opt"
        | "get_with"
        | "get_metadata"
        | "get_metadata_opt"
        | "get_metadata_with"
        | "get_metadata_opt_with" => Verbs(&["get"], None),
        "list" | "list_metadata" => Verbs(&["list"], None),
        "watch" | "watch_metadata" => Verbs(&["watch"], None),
        "create" => Verbs(&["create"], None),
        "patch" | "patch_metadata" => Verbs(&["patch"], None),
        "replace" => Verbs(&["update"], None),
        "delete" => Verbs(&["delete"], None),
        "delete_collection" => Verbs(&["deletecollection"], None),
        "entry" => Verbs(&["get", "create", "update"], None),
        "get_status" => Verbs(&["get"], Some("status")),
        "patch_status" => Verbs(&["patch"], Some("status")),
        "replace_status" => Verbs(&["update"], Some("status")),
        "get_scale" => Verbs(&["get"], Some("scale")),
        "patch_scale" => Verbs(&["patch"], Some("scale")),
        "replace_scale" => Verbs(&["update"], Some("scale")),
        "evict" => Verbs(&["create"], Some("eviction")),
        "logs" | "log_stream" => Verbs(&["get"], Some("log")),
        "get_subresource" => Subresource("get"),
        "create_subresource" => Subresource("create"),
        "patch_subresource" => Subresource("patch"),
        "replace_subresource" => Subresource("update"),
        "resource_url" | "into_client" => Local,
        name if TRANSPARENT_METHODS.contains(&name) => Local,
        _ => return None,
    })
}

/// kube-runtime functions that list and then watch the `Api` given as their first argument.
const WATCHING_FUNCTIONS: &[&str] = &["watcher", "metadata_watcher", "watch_object"];
/// kube-runtime functions and methods that do the same: `wait::await_condition(api, ..)`,
/// `Controller::new(api, ..)`, `controller.owns(api, ..)`, `controller.watches(api, ..)`.
const WATCHING_METHODS: &[&str] = &["owns", "watches"];

/// Folders of `src/` that hold operator tools rather than extender code: `replay` (the in-cluster
/// trace replay, `gpu-lab replay`, creates its own nodes and pods with the operator's rights).
pub const OPERATOR_TOOLS: &[&str] = &["replay"];

/// Folders of `src/` that run as another component with their own service account and rules:
/// `agent` (`gpu-extender node-agent`, the DaemonSet of `deploy/node-agent/`), checked on its own
/// by `tests/rbac.rs`.
pub const OTHER_COMPONENTS: &[&str] = &["agent"];

/// Reads every `.rs` file under `dir`, except the [`OPERATOR_TOOLS`].
pub fn scan_dir(dir: &Path) -> Scan {
    let mut files = Vec::new();
    collect_rs_files(dir, &mut files);
    // Operator tools that run with the operator's own kubeconfig, never with the extender's
    // service account: their calls are not the extender's and need none of its rights.
    let tools: Vec<PathBuf> = OPERATOR_TOOLS
        .iter()
        .chain(OTHER_COMPONENTS)
        .map(|tool| dir.join(tool))
        .collect();
    files.retain(|path| !tools.iter().any(|tool| path.starts_with(tool)));
    files.sort();
    let root = dir.parent().unwrap_or(dir);
    let sources: Vec<(String, String)> = files
        .iter()
        .map(|path| {
            let name = path
                .strip_prefix(root)
                .unwrap_or(path)
                .display()
                .to_string();
            let text = std::fs::read_to_string(path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            (name, text)
        })
        .collect();
    scan_sources(&sources)
}

fn collect_rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            collect_rs_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Reads the given `(file name, source)` pairs as one crate.
pub fn scan_sources(sources: &[(String, String)]) -> Scan {
    let mut scan = Scan::default();
    let mut parsed = Vec::new();
    let mut test_files = Vec::new();
    for (name, text) in sources {
        match syn::parse_file(text) {
            Ok(file) => {
                test_files.extend(test_module_files(name, &file));
                parsed.push((name.as_str(), strip_test_code(file)));
            }
            Err(e) => scan.problems.push(format!(
                "{name}:{}: not parsable as Rust: {e}",
                e.span().start().line
            )),
        }
    }
    parsed.retain(|(name, _)| !test_files.iter().any(|t| t == name));
    scan.files = parsed.len();

    // Pass 1, crate-wide: struct fields and functions declared with an `Api<K>` type.
    let mut crate_types = CrateTypes::default();
    for (name, file) in &parsed {
        let imports = Imports::of(file);
        let mut declarations = Declarations {
            imports: &imports,
            types: &mut crate_types,
            file: name,
            problems: &mut scan.problems,
        };
        declarations.visit_file(file);
    }

    // Pass 2: the calls.
    for (name, file) in &parsed {
        let imports = Imports::of(file);
        let mut calls = Calls {
            file: name,
            imports: &imports,
            crate_types: &crate_types,
            scopes: Vec::new(),
            generics: Vec::new(),
            explained: Vec::new(),
            scan: &mut scan,
        };
        calls.visit_file(file);
    }
    scan.uses.sort_by(|a, b| a.permission.cmp(&b.permission));
    scan
}

// ---------------------------------------------------------------------------------------------
// Test code is not shipped: drop `#[cfg(test)]` items before reading.

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && attr
                .parse_args::<syn::Meta>()
                .is_ok_and(|meta| meta.path().is_ident("test"))
    })
}

/// The files of `#[cfg(test)] mod name;` declared in `file` (`src/k8s/watch.rs` declaring
/// `mod tests;` → `src/k8s/watch/tests.rs` and `src/k8s/watch/tests/mod.rs`).
fn test_module_files(file_name: &str, file: &syn::File) -> Vec<String> {
    let path = Path::new(file_name);
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default();
    let dir = path.parent().unwrap_or(Path::new(""));
    let module_dir = if matches!(stem, "mod" | "lib" | "main") {
        dir.to_path_buf()
    } else {
        dir.join(stem)
    };
    let mut files = Vec::new();
    for item in &file.items {
        if let syn::Item::Mod(m) = item
            && m.content.is_none()
            && is_cfg_test(&m.attrs)
        {
            let name = m.ident.to_string();
            files.push(module_dir.join(format!("{name}.rs")));
            files.push(module_dir.join(&name).join("mod.rs"));
            for attr in &m.attrs {
                if let syn::Meta::NameValue(nv) = &attr.meta
                    && nv.path.is_ident("path")
                    && let syn::Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Str(p),
                        ..
                    }) = &nv.value
                {
                    files.push(dir.join(p.value()));
                }
            }
        }
    }
    files.iter().map(|p| p.display().to_string()).collect()
}

fn strip_test_code(mut file: syn::File) -> syn::File {
    file.items.retain(|item| !item_is_test(item));
    for item in &mut file.items {
        strip_test_items(item);
    }
    file
}

fn item_is_test(item: &syn::Item) -> bool {
    match item {
        syn::Item::Fn(f) => is_cfg_test(&f.attrs),
        syn::Item::Mod(m) => is_cfg_test(&m.attrs),
        syn::Item::Impl(i) => is_cfg_test(&i.attrs),
        syn::Item::Use(u) => is_cfg_test(&u.attrs),
        syn::Item::Struct(s) => is_cfg_test(&s.attrs),
        syn::Item::Const(c) => is_cfg_test(&c.attrs),
        syn::Item::Static(s) => is_cfg_test(&s.attrs),
        _ => false,
    }
}

fn strip_test_items(item: &mut syn::Item) {
    match item {
        syn::Item::Mod(m) => {
            if let Some((_, items)) = &mut m.content {
                items.retain(|i| !item_is_test(i));
                items.iter_mut().for_each(strip_test_items);
            }
        }
        syn::Item::Impl(i) => i.items.retain(|item| match item {
            syn::ImplItem::Fn(f) => !is_cfg_test(&f.attrs),
            _ => true,
        }),
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------------
// Names: what each identifier of a file stands for, from its `use` items.

/// Local name → full path, e.g. `watch_stream` → `kube::runtime::watcher`.
#[derive(Default)]
struct Imports(HashMap<String, Vec<String>>);

impl Imports {
    fn of(file: &syn::File) -> Self {
        struct UseVisitor<'a>(&'a mut Imports);
        impl<'ast> Visit<'ast> for UseVisitor<'_> {
            fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
                self.0.add(&item.tree, Vec::new());
            }
        }
        let mut imports = Imports::default();
        UseVisitor(&mut imports).visit_file(file);
        imports
    }

    fn add(&mut self, tree: &syn::UseTree, mut prefix: Vec<String>) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.add(&p.tree, prefix);
            }
            syn::UseTree::Name(n) => {
                let name = n.ident.to_string();
                if name == "self" {
                    if let Some(last) = prefix.last().cloned() {
                        self.0.insert(last, prefix);
                    }
                } else {
                    prefix.push(name.clone());
                    self.0.insert(name, prefix);
                }
            }
            syn::UseTree::Rename(r) => {
                if r.ident != "self" {
                    prefix.push(r.ident.to_string());
                }
                self.0.insert(r.rename.to_string(), prefix);
            }
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.add(tree, prefix.clone());
                }
            }
            syn::UseTree::Glob(_) => {}
        }
    }

    /// The full path a path in the code stands for: its first segment replaced by what the file
    /// imported under that name.
    fn resolve(&self, path: &syn::Path) -> Vec<String> {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.resolve_names(segments)
    }

    fn resolve_names(&self, segments: Vec<String>) -> Vec<String> {
        match segments.split_first() {
            Some((first, rest)) => match self.0.get(first) {
                Some(full) => full.iter().chain(rest).cloned().collect(),
                None => segments,
            },
            None => segments,
        }
    }
}

/// The text of a string literal expression.
fn string_literal(expr: &syn::Expr) -> Option<String> {
    match expr {
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(s),
            ..
        }) => Some(s.value()),
        _ => None,
    }
}

/// The path an expression spells out: a string literal, or the format string of `format!(..)`
/// (its `{}` standing for the namespace).
fn path_template(expr: &syn::Expr) -> Option<String> {
    match expr {
        syn::Expr::Lit(_) => string_literal(expr),
        syn::Expr::Macro(m) if m.mac.path.is_ident("format") => {
            let first = m.mac.tokens.clone().into_iter().next()?;
            match syn::parse2::<syn::LitStr>(first.into()) {
                Ok(literal) => Some(literal.value()),
                Err(_) => None,
            }
        }
        syn::Expr::Reference(r) => path_template(&r.expr),
        syn::Expr::Paren(p) => path_template(&p.expr),
        _ => None,
    }
}

/// The kind whose collection `path` is: `/api/v1/[namespaces/{ns}/]<resource>` or
/// `/apis/<group>/<version>/[namespaces/{ns}/]<resource>`, the resource one of [`KINDS`].
fn kind_of_collection_path(path: &str) -> ApiOf {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match segments.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return ApiOf::Unknown(format!("{path:?} is not an API path")),
    };
    let resource = match rest {
        ["namespaces", _, resource] | [resource] => *resource,
        _ => {
            return ApiOf::Unknown(format!(
                "{path:?} is not a collection (Request::new takes the path without a name)"
            ));
        }
    };
    match KINDS.iter().find(|(_, g, r)| *g == group && *r == resource) {
        Some((key, _, _)) => ApiOf::Kind(Kind(key)),
        None => ApiOf::Unknown(format!("{path:?}: {group}/{resource} is not in KINDS")),
    }
}

fn from_kube(path: &[String]) -> bool {
    path.first()
        .is_some_and(|first| matches!(first.as_str(), "kube" | "kube_runtime" | "kube_client"))
}

// ---------------------------------------------------------------------------------------------
// Types: `Api<K>` and which kind K is.

/// A Kubernetes kind, as its path under `k8s_openapi::api` (`core::v1::Pod`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Kind(&'static str);

impl Kind {
    fn group_and_resource(&self) -> (&'static str, &'static str) {
        KINDS
            .iter()
            .find(|(key, _, _)| *key == self.0)
            .map(|(_, group, resource)| (*group, *resource))
            .expect("kinds come from KINDS")
    }
}

/// What reading a type or expression told about an `Api`.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ApiOf {
    Kind(Kind),
    /// An `Api`, but its kind could not be settled (the reason).
    Unknown(String),
}

/// The kind a type path names, through the file's imports; `PartialObjectMeta<K>` is K.
fn kind_of_type_path(path: &syn::Path, imports: &Imports, generics: &[String]) -> ApiOf {
    let last = path
        .segments
        .last()
        .map(|s| s.ident.to_string())
        .unwrap_or_default();
    if last == "PartialObjectMeta"
        && let Some(inner) = first_generic_type(path)
    {
        return kind_of_type(inner, imports, generics);
    }
    if last == DYNAMIC_OBJECT && from_kube(&imports.resolve(path)) {
        return ApiOf::Kind(Kind(DYNAMIC_OBJECT));
    }
    if path.segments.len() == 1 && generics.contains(&last) {
        return ApiOf::Unknown(format!("generic kind {last}"));
    }
    let full = imports.resolve(path);
    let candidates: Vec<&(&str, &str, &str)> =
        if let Some(at) = full.iter().position(|s| s == "api") {
            // k8s_openapi::api::core::v1::Pod (or a path through a re-export of it)
            let key = full[at + 1..].join("::");
            KINDS.iter().filter(|(k, _, _)| *k == key).collect()
        } else if full.len() == 1 {
            // A bare name the file does not import by name (glob import): unique last segments only.
            KINDS
                .iter()
                .filter(|(k, _, _)| k.rsplit("::").next() == Some(last.as_str()))
                .collect()
        } else {
            Vec::new()
        };
    match candidates.as_slice() {
        [(key, _, _)] => ApiOf::Kind(Kind(key)),
        [] => ApiOf::Unknown(format!(
            "kind {} is not in KINDS (tests/support/api_calls.rs)",
            full.join("::")
        )),
        _ => ApiOf::Unknown(format!(
            "kind {last} is ambiguous: import it by its full path"
        )),
    }
}

fn kind_of_type(ty: &syn::Type, imports: &Imports, generics: &[String]) -> ApiOf {
    match ty {
        syn::Type::Path(p) => kind_of_type_path(&p.path, imports, generics),
        other => ApiOf::Unknown(format!("kind `{}`", tokens(other))),
    }
}

fn first_generic_type(path: &syn::Path) -> Option<&syn::Type> {
    let syn::PathArguments::AngleBracketed(args) = &path.segments.last()?.arguments else {
        return None;
    };
    args.args.iter().find_map(|arg| match arg {
        syn::GenericArgument::Type(ty) => Some(ty),
        _ => None,
    })
}

/// `Api<K>`, `&Api<K>`, `kube::Api<K>`: the kind; anything else: `None`.
fn api_type(ty: &syn::Type, imports: &Imports, generics: &[String]) -> Option<ApiOf> {
    match ty {
        syn::Type::Reference(r) => api_type(&r.elem, imports, generics),
        syn::Type::Paren(p) => api_type(&p.elem, imports, generics),
        syn::Type::Path(p) if is_api_path(&p.path, imports) => {
            Some(match first_generic_type(&p.path) {
                Some(kind) => kind_of_type(kind, imports, generics),
                None => ApiOf::Unknown("Api without its kind".to_owned()),
            })
        }
        // Option<Api<K>>, Arc<Api<K>>, ...: the methods that reach the Api are transparent too.
        syn::Type::Path(p)
            if p.path
                .segments
                .last()
                .is_some_and(|s| WRAPPER_TYPES.contains(&s.ident.to_string().as_str())) =>
        {
            first_generic_type(&p.path).and_then(|inner| api_type(inner, imports, generics))
        }
        _ => None,
    }
}

/// Types read through to the Api they hold.
const WRAPPER_TYPES: &[&str] = &["Option", "Arc", "Rc", "Box", "Mutex", "RwLock", "OnceLock"];
/// Methods that give back (a reference to) the Api they are called on.
const TRANSPARENT_METHODS: &[&str] = &[
    "clone",
    "to_owned",
    "as_ref",
    "as_mut",
    "unwrap",
    "expect",
    "borrow",
    "deref",
    "lock",
    "read",
    "write",
    "get_or_init",
];

/// The path names kube's `Api` (the type itself, not a path through it).
fn is_api_path(path: &syn::Path, imports: &Imports) -> bool {
    is_api_names(imports.resolve(path))
}

fn is_api_names(full: Vec<String>) -> bool {
    full.last().is_some_and(|last| last == "Api") && (full.len() == 1 || from_kube(&full))
}

fn tokens<T: quote::ToTokens>(node: &T) -> String {
    node.to_token_stream().to_string()
}

fn line(span: Span) -> usize {
    span.start().line
}

// ---------------------------------------------------------------------------------------------
// Pass 1: fields and functions declared with an Api type, crate-wide.

/// What a name stands for: an Api (of a kind, or of a kind that cannot be settled), or
/// something else. Names are crate-wide, so a field or function name declared both ways (or with
/// two kinds) cannot be settled.
type Slot = Option<ApiOf>;

#[derive(Default)]
struct CrateTypes {
    /// Field name → what fields of that name hold.
    fields: HashMap<String, Slot>,
    /// Function or method name → what functions of that name return.
    functions: HashMap<String, Slot>,
}

impl CrateTypes {
    fn declare(map: &mut HashMap<String, Slot>, name: String, slot: Slot) {
        let merged = match map.get(&name) {
            Some(existing) if *existing != slot => Some(ApiOf::Unknown(format!(
                "`{name}` is declared with different types in the crate"
            ))),
            _ => slot,
        };
        map.insert(name, merged);
    }

    fn field(&self, name: &str) -> Slot {
        self.fields.get(name).cloned().flatten()
    }

    fn function(&self, name: &str) -> Slot {
        self.functions.get(name).cloned().flatten()
    }
}

struct Declarations<'a> {
    imports: &'a Imports,
    types: &'a mut CrateTypes,
    file: &'a str,
    problems: &'a mut Vec<String>,
}

impl<'ast> Visit<'ast> for Declarations<'_> {
    fn visit_field(&mut self, field: &'ast syn::Field) {
        if let Some(name) = &field.ident {
            let slot = api_type(&field.ty, self.imports, &[]);
            CrateTypes::declare(&mut self.types.fields, name.to_string(), slot);
        }
        if field.ident.is_none() && api_type(&field.ty, self.imports, &[]).is_some() {
            self.problems.push(format!(
                "{}:{}: an Api in a tuple struct field: name the field",
                self.file,
                line(field.span())
            ));
        }
        visit::visit_field(self, field);
    }

    fn visit_signature(&mut self, sig: &'ast syn::Signature) {
        let slot = match &sig.output {
            syn::ReturnType::Type(_, ty) => {
                api_type(ty, self.imports, &generic_names(&sig.generics))
            }
            syn::ReturnType::Default => None,
        };
        CrateTypes::declare(&mut self.types.functions, sig.ident.to_string(), slot);
        visit::visit_signature(self, sig);
    }
}

fn generic_names(generics: &syn::Generics) -> Vec<String> {
    generics
        .type_params()
        .map(|p| p.ident.to_string())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Pass 2: the calls.

struct Calls<'a> {
    file: &'a str,
    imports: &'a Imports,
    crate_types: &'a CrateTypes,
    /// Local variables, innermost scope last: an Api, or (`None`) something else that shadows
    /// an outer Api of the same name.
    scopes: Vec<HashMap<String, Slot>>,
    /// Generic type parameters of the enclosing functions.
    generics: Vec<Vec<String>>,
    /// `Api` constructor expressions already attributed (by position), so they are not also
    /// reported as constructors of unknown kind.
    explained: Vec<(usize, usize)>,
    scan: &'a mut Scan,
}

impl Calls<'_> {
    fn generics(&self) -> Vec<String> {
        self.generics.iter().flatten().cloned().collect()
    }

    fn local(&self, name: &str) -> Slot {
        self.scopes
            .iter()
            .rev()
            .find_map(|scope| scope.get(name).cloned())
            .flatten()
    }

    /// Declares the names `pat` binds: to `slot` for a plain name, to "not an Api" for the
    /// names inside a destructuring pattern.
    fn bind(&mut self, pat: &syn::Pat, slot: Slot) {
        match pat {
            syn::Pat::Ident(p) => {
                if let Some(scope) = self.scopes.last_mut() {
                    scope.insert(p.ident.to_string(), slot);
                }
            }
            syn::Pat::Type(t) => self.bind(&t.pat, slot),
            syn::Pat::Reference(r) => self.bind(&r.pat, slot),
            syn::Pat::Tuple(t) => t.elems.iter().for_each(|p| self.bind(p, None)),
            syn::Pat::TupleStruct(t) => t.elems.iter().for_each(|p| self.bind(p, None)),
            syn::Pat::Struct(st) => st.fields.iter().for_each(|f| self.bind(&f.pat, None)),
            syn::Pat::Slice(sl) => sl.elems.iter().for_each(|p| self.bind(p, None)),
            _ => {}
        }
    }

    /// Marks an Api constructor expression as attributed to `api` from its context.
    fn explain(&mut self, expr: &syn::Expr) {
        let start = expr.span().start();
        self.explained.push((start.line, start.column));
    }

    fn is_explained(&self, span: Span) -> bool {
        let start = span.start();
        self.explained.contains(&(start.line, start.column))
    }

    /// What `expr` evaluates to, if it is an Api.
    fn api_of(&self, expr: &syn::Expr) -> Option<ApiOf> {
        match expr {
            syn::Expr::Path(p) if p.path.segments.len() == 1 => {
                self.local(&p.path.segments[0].ident.to_string())
            }
            syn::Expr::Field(f) => match &f.member {
                syn::Member::Named(name) => self.crate_types.field(&name.to_string()),
                syn::Member::Unnamed(_) => None,
            },
            syn::Expr::Call(call) => self.api_of_call(call),
            syn::Expr::MethodCall(m) => {
                let method = m.method.to_string();
                if TRANSPARENT_METHODS.contains(&method.as_str()) {
                    self.api_of(&m.receiver)
                } else {
                    self.crate_types.function(&method)
                }
            }
            syn::Expr::Reference(r) => self.api_of(&r.expr),
            syn::Expr::Paren(p) => self.api_of(&p.expr),
            syn::Expr::Try(t) => self.api_of(&t.expr),
            syn::Expr::Await(a) => self.api_of(&a.base),
            _ => None,
        }
    }

    /// `Api::<K>::all(..)` and the like; calls of crate functions returning an Api.
    fn api_of_call(&self, call: &syn::ExprCall) -> Option<ApiOf> {
        let syn::Expr::Path(func) = &*call.func else {
            return None;
        };
        let path = &func.path;
        let n = path.segments.len();
        if n >= 2 {
            // Api::<K>::constructor: the segment before the last is `Api`, with the kind.
            let type_segments: Vec<String> = path
                .segments
                .iter()
                .take(n - 1)
                .map(|s| s.ident.to_string())
                .collect();
            if is_api_names(self.imports.resolve_names(type_segments)) {
                let kind = match &path.segments[n - 2].arguments {
                    syn::PathArguments::AngleBracketed(args) => {
                        args.args.iter().find_map(|arg| match arg {
                            syn::GenericArgument::Type(ty) => Some(ty),
                            _ => None,
                        })
                    }
                    _ => None,
                };
                return Some(match kind {
                    Some(kind) => kind_of_type(kind, self.imports, &self.generics()),
                    None => ApiOf::Unknown("Api constructor without the kind written".to_owned()),
                });
            }
        }
        // kube's `Request::new(path)`: a request builder for the resource its path names, whose
        // methods are `Api`'s (`.list(..)`, `.create_subresource("binding", ..)`, ...).
        let full = self.imports.resolve(path);
        if from_kube(&full) && full.ends_with(&["Request".to_owned(), "new".to_owned()]) {
            return Some(match call.args.first().and_then(path_template) {
                Some(template) => kind_of_collection_path(&template),
                None => ApiOf::Unknown(
                    "Request::new without its path written as a string literal or format!"
                        .to_owned(),
                ),
            });
        }
        let name = path.segments.last()?.ident.to_string();
        if n == 1
            || path
                .segments
                .first()
                .is_some_and(|s| s.ident == "crate" || s.ident == "self" || s.ident == "super")
        {
            return self.crate_types.function(&name);
        }
        None
    }

    fn record(&mut self, api: &ApiOf, verbs: &[&str], sub: Option<&str>, span: Span, what: &str) {
        let site = format!("{}:{}", self.file, line(span));
        match api {
            ApiOf::Kind(kind) => {
                let (group, resource) = kind.group_and_resource();
                let resource = match sub {
                    Some(sub) => format!("{resource}/{sub}"),
                    None => resource.to_owned(),
                };
                for verb in verbs {
                    self.scan.uses.push(ApiUse {
                        permission: Permission::new(group, &resource, verb),
                        site: site.clone(),
                        call: format!("{what} on Api<{}>", kind.0),
                    });
                }
            }
            ApiOf::Unknown(why) => self
                .scan
                .problems
                .push(format!("{site}: {what}: cannot tell the kind ({why})")),
        }
    }

    fn problem(&mut self, span: Span, message: String) {
        let site = format!("{}:{}", self.file, line(span));
        self.scan.problems.push(format!("{site}: {message}"));
    }

    fn first_string_literal(
        args: &syn::punctuated::Punctuated<syn::Expr, syn::Token![,]>,
    ) -> Option<String> {
        string_literal(args.first()?)
    }

    /// A call of a kube-runtime function that lists and watches its first argument.
    fn watching_call(&mut self, call: &syn::ExprCall) -> bool {
        let syn::Expr::Path(func) = &*call.func else {
            return false;
        };
        let full = self.imports.resolve(&func.path);
        let last = full.last().map(String::as_str).unwrap_or_default();
        let watching = from_kube(&full)
            && (WATCHING_FUNCTIONS.contains(&last)
                || last == "await_condition"
                || (last == "new" || last == "new_with")
                    && full.iter().rev().nth(1).is_some_and(|s| s == "Controller"));
        if !watching {
            return false;
        }
        let what = format!("{}(..)", full.join("::"));
        match call.args.first() {
            Some(arg) => match self.api_of(arg) {
                Some(api) => {
                    self.explain(arg);
                    self.record(&api, &["list", "watch"], None, call.span(), &what);
                }
                None => self.problem(
                    call.span(),
                    format!("{what}: its first argument is not recognisably an Api<K>"),
                ),
            },
            None => self.problem(call.span(), format!("{what}: no argument")),
        }
        true
    }

    /// `events::Recorder::new(..)`.
    fn recorder_call(&mut self, call: &syn::ExprCall) {
        let syn::Expr::Path(func) = &*call.func else {
            return;
        };
        let full = self.imports.resolve(&func.path);
        if from_kube(&full) && full.iter().rev().nth(1).is_some_and(|s| s == "Recorder") {
            let (group, resource) = KINDS
                .iter()
                .find(|(k, _, _)| *k == "events::v1::Event")
                .map(|(_, g, r)| (*g, *r))
                .expect("events::v1::Event is in KINDS");
            let site = format!("{}:{}", self.file, line(call.span()));
            for verb in ["create", "patch"] {
                self.scan.uses.push(ApiUse {
                    permission: Permission::new(group, resource, verb),
                    site: site.clone(),
                    call: format!("{}(..)", full.join("::")),
                });
            }
        }
    }
}

impl<'ast> Visit<'ast> for Calls<'_> {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.enter_fn(&f.sig, &f.block);
        visit::visit_item_fn(self, f);
        self.leave_fn();
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.enter_fn(&f.sig, &f.block);
        visit::visit_impl_item_fn(self, f);
        self.leave_fn();
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        self.generics.push(generic_names(&i.generics));
        visit::visit_item_impl(self, i);
        self.generics.pop();
    }

    fn visit_block(&mut self, b: &'ast syn::Block) {
        self.scopes.push(HashMap::new());
        visit::visit_block(self, b);
        self.scopes.pop();
    }

    fn visit_expr_closure(&mut self, c: &'ast syn::ExprClosure) {
        self.scopes.push(HashMap::new());
        for input in &c.inputs {
            let slot = match input {
                syn::Pat::Type(t) => api_type(&t.ty, self.imports, &self.generics()),
                _ => None,
            };
            self.bind(input, slot);
        }
        visit::visit_expr_closure(self, c);
        self.scopes.pop();
    }

    fn visit_local(&mut self, local: &'ast syn::Local) {
        let declared = match &local.pat {
            syn::Pat::Type(t) => api_type(&t.ty, self.imports, &self.generics()),
            _ => None,
        };
        if let (Some(ApiOf::Kind(_)), Some(init)) = (&declared, &local.init) {
            // `let pods: Api<Pod> = Api::all(client);` settles the constructor's kind.
            self.explain(&init.expr);
        }
        // The initialiser first: `let x = x.clone();` reads the outer x.
        if let Some(init) = &local.init {
            self.visit_expr(&init.expr);
            if let Some((_, diverge)) = &init.diverge {
                self.visit_expr(diverge);
            }
        }
        let slot = declared.or_else(|| local.init.as_ref().and_then(|i| self.api_of(&i.expr)));
        self.bind(&local.pat, slot);
    }

    fn visit_expr_struct(&mut self, s: &'ast syn::ExprStruct) {
        // `Feed { pods: Api::all(client), .. }`: the field's declared type gives the kind.
        for field in &s.fields {
            if let syn::Member::Named(name) = &field.member
                && let Some(ApiOf::Kind(_)) = self.crate_types.field(&name.to_string())
            {
                self.explain(&field.expr);
            }
        }
        visit::visit_expr_struct(self, s);
    }

    fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
        if !self.watching_call(call) {
            self.recorder_call(call);
        }
        // An Api made here must go where this reader follows it (a method call on it, a
        // watcher, a variable, a field, a function's result); otherwise its calls would be
        // missed, or, without a kind written, not be attributable.
        if let Some(api) = self.api_of_call(call)
            && !self.is_explained(call.span())
        {
            let why = match api {
                ApiOf::Unknown(why) => why,
                ApiOf::Kind(_) => "it goes where tests/support/api_calls.rs cannot follow it \
                                   (bind it to a variable or field of type Api<K> first)"
                    .to_owned(),
            };
            self.problem(call.span(), format!("`{}`: {why}", tokens(call)));
        }
        visit::visit_expr_call(self, call);
    }

    fn visit_expr_method_call(&mut self, m: &'ast syn::ExprMethodCall) {
        let method = m.method.to_string();
        if let Some(api) = self.api_of(&m.receiver) {
            self.explain(&m.receiver);
            let what = format!(".{method}(..)");
            match (api_method(&method), &api) {
                (Some(Method::Verbs(verbs, sub)), _) => {
                    self.record(&api, verbs, sub, m.span(), &what)
                }
                (Some(Method::Subresource(verb)), _) => match Self::first_string_literal(&m.args) {
                    Some(sub) => {
                        let what = format!(".{method}({sub:?}, ..)");
                        self.record(&api, &[verb], Some(&sub), m.span(), &what);
                    }
                    None => self.problem(
                        m.span(),
                        format!("{what}: name the subresource with a string literal"),
                    ),
                },
                (Some(Method::Local), _) => {}
                // Not a method of Api: on a settled Api it is one this table is missing; on a
                // name that only may be an Api it is most likely something else's method.
                (None, ApiOf::Kind(_)) => self.problem(
                    m.span(),
                    format!(
                        "{what} on an Api: not in the method table of tests/support/api_calls.rs"
                    ),
                ),
                (None, ApiOf::Unknown(_)) => {}
            }
        }
        if WATCHING_METHODS.contains(&method.as_str())
            && let Some(arg) = m.args.first()
            && let Some(api) = self.api_of(arg)
        {
            self.explain(arg);
            let what = format!(".{method}(api, ..)");
            self.record(&api, &["list", "watch"], None, m.span(), &what);
        }
        visit::visit_expr_method_call(self, m);
    }
}

impl Calls<'_> {
    fn enter_fn(&mut self, sig: &syn::Signature, body: &syn::Block) {
        self.generics.push(generic_names(&sig.generics));
        self.scopes.push(HashMap::new());
        for input in &sig.inputs {
            if let syn::FnArg::Typed(t) = input {
                let slot = api_type(&t.ty, self.imports, &self.generics());
                self.bind(&t.pat, slot);
            }
        }
        // `fn pods(&self) -> Api<Pod> { Api::all(self.client.clone()) }`
        if let syn::ReturnType::Type(_, ty) = &sig.output
            && let Some(ApiOf::Kind(_)) = api_type(ty, self.imports, &self.generics())
            && let Some(syn::Stmt::Expr(tail, None)) = body.stmts.last()
        {
            self.explain(tail);
        }
    }

    fn leave_fn(&mut self) {
        self.scopes.pop();
        self.generics.pop();
    }
}
