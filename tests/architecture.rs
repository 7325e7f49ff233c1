//! Architecture guard: the rules the compiler cannot see.
//!
//! - The engine crate (`crates/engine`) stays pure. What it may call is fenced by its manifest
//!   (checked here: no dependency beyond the allowed few, so no I/O, async, Kubernetes, metrics,
//!   logging or randomness crate) and by its `clippy.toml` (no clock, file, socket, thread,
//!   environment, process or lock from `std`; no printing), which `make lint` enforces.
//! - Every `.rs` file of every crate's `src/` opens with a `//!` line saying what it owns.
//! - The rooms of the service's `src/` (its top-level modules) are layered ([`LAYERS`]): a room
//!   imports only rooms below it, never one beside or above it, outside its `#[cfg(test)]` code.
//!   Cycles between modules inside a room are found by `scripts/module-graph.sh`
//!   (cargo-modules, in `make lint`); see docs/decisions/0007-one-room-for-shared-state.md.

use std::fs;
use std::path::{Path, PathBuf};

/// The only crates the engine may depend on: an error derive and a hasher. Anything else (an
/// async runtime, an HTTP or Kubernetes client, metrics, logging, randomness, locks) belongs in
/// the crates that use the engine.
const ENGINE_DEPENDENCIES: &[&str] = &["thiserror", "foldhash"];

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.unwrap_or_else(|e| panic!("{e}")).path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The names in one `[section]` of a Cargo manifest: the keys of its `name = ...` and
/// `name.workspace = true` lines.
fn manifest_section(manifest: &str, section: &str) -> Vec<String> {
    let header = format!("[{section}]");
    manifest
        .lines()
        .skip_while(|line| line.trim() != header)
        .skip(1)
        .take_while(|line| !line.trim_start().starts_with('['))
        .filter(|line| !line.trim_start().starts_with('#') && line.contains('='))
        .filter_map(|line| line.split(['=', '.']).next())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .collect()
}

#[test]
fn the_engine_depends_on_nothing_that_does_io() {
    let manifest = read(&workspace().join("crates/engine/Cargo.toml"));
    let dependencies = manifest_section(&manifest, "dependencies");
    assert!(
        dependencies.iter().any(|name| name == "thiserror"),
        "the manifest reader found none of the engine's dependencies: {dependencies:?}"
    );
    let foreign: Vec<&String> = dependencies
        .iter()
        .filter(|name| !ENGINE_DEPENDENCIES.contains(&name.as_str()))
        .collect();
    assert!(
        foreign.is_empty(),
        "the engine must stay pure; these dependencies are not among {ENGINE_DEPENDENCIES:?}: \
         {foreign:?}"
    );
    // The fence on std is the engine's clippy.toml: it must name the clock, locks and I/O.
    let fence = read(&workspace().join("crates/engine/clippy.toml"));
    for item in [
        "std::time::Instant",
        "std::time::SystemTime",
        "std::sync::Mutex",
        "std::fs",
    ] {
        assert!(
            fence.contains(item),
            "crates/engine/clippy.toml does not fence {item}"
        );
    }
}

#[test]
fn the_manifest_reader_reads_sections() {
    let manifest = "[package]\nname = \"x\"\n[dependencies]\n# comment = 1\na = \"1\"\nb.workspace = true\nc = { version = \"1\" }\n\n[dev-dependencies]\nd = \"1\"\n";
    assert_eq!(manifest_section(manifest, "dependencies"), ["a", "b", "c"]);
    assert_eq!(manifest_section(manifest, "dev-dependencies"), ["d"]);
}

#[test]
fn every_module_opens_with_a_doc_line() {
    let mut files = rust_files(&src());
    for krate in ["engine", "sim", "lab", "test-support"] {
        files.extend(rust_files(
            &workspace().join("crates").join(krate).join("src"),
        ));
    }
    assert!(
        files.iter().any(|f| f.ends_with("lib.rs")),
        "no files found"
    );
    let missing: Vec<String> = files
        .iter()
        .filter(|file| !opens_with_module_doc(&read(file)))
        .map(|file| file.display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "these files do not open with a `//!` line:\n{}",
        missing.join("\n")
    );
}

fn opens_with_module_doc(text: &str) -> bool {
    text.lines()
        .find(|line| !line.trim().is_empty())
        .is_some_and(|line| line.trim_start().starts_with("//!"))
}

/// The rooms of the service's `src/`, lowest layer first (the engine is a crate of its own,
/// below them all). A room may import the rooms of lower layers only: the readers of the
/// engine's values (configuration, the explanation and inspection reports) none; the
/// Kubernetes-object translation those; the
/// shared state (table, policy in force, readiness, the verbs' decisions) everything below it;
/// the metrics the state; the watchers and binder (`k8s`) and the extender's HTTP surface
/// (`http`) and the scheduler-estimator (`estimator`) the state and the metrics but not each
/// other; the composition (`service`) and the
/// operator commands (`cli`) whatever they wire together.
const LAYERS: &[&[&str]] = &[
    &["build_info", "config", "explain", "inspect"],
    &["objects"],
    &["state"],
    &["telemetry"],
    &["k8s", "http", "estimator"],
    &["service", "cli"],
    &["agent"],
];

fn layer_of(room: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&room))
}

/// The module path of a file under `src/`: `k8s/bind.rs` is `[k8s, bind]`, `state/mod.rs` is
/// `[state]`.
fn module_path(file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src()).unwrap_or(file);
    let mut segments: Vec<String> = relative
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if segments.last().is_some_and(|last| last == "mod") {
        segments.pop();
    }
    segments
}

#[test]
fn every_room_imports_only_rooms_below_it() {
    let rooms: Vec<String> = read(&src().join("lib.rs"))
        .lines()
        .filter_map(|line| line.strip_prefix("pub mod "))
        .map(|rest| rest.trim_end_matches(';').to_owned())
        .collect();
    assert!(rooms.len() >= 10, "too few rooms in lib.rs: {rooms:?}");
    for room in &rooms {
        assert!(
            layer_of(room).is_some(),
            "the room `{room}` has no layer in LAYERS: place it"
        );
    }
    let mut violations = Vec::new();
    let mut checked = 0;
    for file in rust_files(&src()) {
        let module = module_path(&file);
        let Some(room) = module
            .first()
            .filter(|_| module.len() > 1 || rooms.contains(&module[0]))
        else {
            continue; // lib.rs and main.rs
        };
        // A `tests.rs` child is a `#[cfg(test)]` module by this project's convention.
        if module.last().is_some_and(|last| last == "tests") {
            continue;
        }
        checked += 1;
        for (path, target) in rooms_named(&module, &read(&file)) {
            if let Some(problem) = layer_violation(room, &target) {
                violations.push(format!("{}: `{path}`: {problem}", file.display()));
            }
        }
    }
    assert!(checked >= 40, "the guard checked only {checked} files");
    assert!(
        violations.is_empty(),
        "imports that break the layer order:\n{}",
        violations.join("\n")
    );
}

/// Why `room` may not import `target`, if it may not.
fn layer_violation(room: &str, target: &str) -> Option<String> {
    if room == target {
        return None;
    }
    let (Some(own), Some(theirs)) = (layer_of(room), layer_of(target)) else {
        return Some(format!("`{target}` is not a room with a layer"));
    };
    (theirs >= own).then(|| {
        let relation = if theirs == own { "beside" } else { "above" };
        format!("{room} (layer {own}) imports {target}, a room {relation} it (layer {theirs})")
    })
}

/// Every crate-internal path in `source` (the file of module `module`) that leaves its room, and
/// the room it reaches: `crate::x::...` and `super::` chains that climb out of the room, in
/// `use` trees and in code alike. `#[cfg(test)]` items are skipped.
fn rooms_named(module: &[String], source: &str) -> Vec<(String, String)> {
    let tokens = without_test_items(&tokens(&strip_comments_and_literals(source)));
    let mut paths: Vec<Vec<String>> = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i] == "use" {
            let end = tokens[i..]
                .iter()
                .position(|t| t == ";")
                .map_or(tokens.len(), |p| i + p);
            paths.extend(expand_use_tree(&tokens[i + 1..end]));
            i = end + 1;
            continue;
        }
        let continues_a_path = i > 0 && tokens[i - 1] == "::";
        if (tokens[i] == "crate" || tokens[i] == "super") && !continues_a_path {
            let mut path = vec![tokens[i].clone()];
            let mut j = i + 1;
            while tokens.get(j).is_some_and(|t| t == "::")
                && tokens.get(j + 1).is_some_and(|t| is_ident(t))
            {
                path.push(tokens[j + 1].clone());
                j += 2;
            }
            paths.push(path);
            i = j;
            continue;
        }
        i += 1;
    }
    let mut found = Vec::new();
    for path in paths {
        let absolute: Vec<String> = match path.first().map(String::as_str) {
            Some("crate") => path[1..].to_vec(),
            Some("super") => {
                let climbs = path.iter().take_while(|s| *s == "super").count();
                let Some(kept) = module.len().checked_sub(climbs) else {
                    continue;
                };
                module[..kept]
                    .iter()
                    .chain(&path[climbs..])
                    .cloned()
                    .collect()
            }
            _ => continue,
        };
        if let Some(target) = absolute.first()
            && Some(target) != module.first()
        {
            found.push((path.join("::"), target.clone()));
        }
    }
    found
}

/// `tokens` without the items marked `#[cfg(test)]`: from the attribute to the end of the item
/// (its `;`, or its outermost `{ ... }`).
fn without_test_items(tokens: &[String]) -> Vec<String> {
    let marker = ["#", "[", "cfg", "(", "test", ")", "]"];
    let mut out = Vec::with_capacity(tokens.len());
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i..].starts_with(&marker.map(str::to_owned)) {
            let mut j = i + marker.len();
            let mut depth = 0usize;
            while let Some(token) = tokens.get(j) {
                j += 1;
                match token.as_str() {
                    "{" => depth += 1,
                    "}" => {
                        depth = depth.saturating_sub(1);
                        if depth == 0 {
                            break;
                        }
                    }
                    ";" if depth == 0 => break,
                    _ => {}
                }
            }
            i = j;
            continue;
        }
        out.push(tokens[i].clone());
        i += 1;
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The scanner

/// The full paths a `use` tree (the tokens between `use` and `;`) imports, as segments:
/// `std::{fs, sync::Arc}` gives `std::fs` and `std::sync::Arc`.
fn expand_use_tree(tokens: &[String]) -> Vec<Vec<String>> {
    fn tree(tokens: &[String], pos: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let mut path = prefix.to_vec();
        while let Some(token) = tokens.get(*pos).map(String::as_str) {
            match token {
                "{" => {
                    *pos += 1;
                    while *pos < tokens.len() {
                        tree(tokens, pos, &path, out);
                        match tokens.get(*pos).map(String::as_str) {
                            Some(",") => *pos += 1,
                            Some("}") => {
                                *pos += 1;
                                break;
                            }
                            _ => {
                                *pos += 1;
                            }
                        }
                    }
                    return;
                }
                // `as alias`: the alias does not change what is imported.
                "as" => *pos += 2,
                "::" | "*" => *pos += 1,
                t if is_ident(t) => {
                    path.push(t.to_owned());
                    *pos += 1;
                }
                _ => break,
            }
        }
        if !path.is_empty() {
            out.push(path);
        }
    }
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < tokens.len() {
        let before = pos;
        tree(tokens, &mut pos, &[], &mut out);
        if pos == before {
            pos += 1;
        }
    }
    out
}

fn is_ident(token: &str) -> bool {
    let mut chars = token.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Identifiers, `::`, and single punctuation characters.
fn tokens(code: &str) -> Vec<String> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
        } else if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push("::".to_owned());
            i += 2;
        } else {
            out.push(c.to_string());
            i += 1;
        }
    }
    out
}

/// The code with comments, string literals and char literals blanked out (lifetimes kept).
fn strip_comments_and_literals(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && is_raw_string(&chars, i) {
            i += 1;
            let mut hashes = 0;
            while chars.get(i) == Some(&'#') {
                hashes += 1;
                i += 1;
            }
            i += 1; // the opening quote
            while i < chars.len() {
                if chars[i] == '"' && (1..=hashes).all(|h| chars.get(i + h) == Some(&'#')) {
                    i += 1 + hashes;
                    break;
                }
                i += 1;
            }
            out.push_str("\"\"");
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' {
            if next == Some('\\') {
                // An escaped char literal: skip to its closing quote.
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
                out.push_str("' '");
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push_str("' '");
            } else {
                // A lifetime or label.
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Whether `r` at `i` starts a raw string (`r"`, `r#"`) rather than ending an identifier.
fn is_raw_string(chars: &[char], i: usize) -> bool {
    let starts_token = i == 0 || !(chars[i - 1].is_ascii_alphanumeric() || chars[i - 1] == '_');
    let mut j = i + 1;
    while chars.get(j) == Some(&'#') {
        j += 1;
    }
    starts_token && chars.get(j) == Some(&'"')
}

// ---------------------------------------------------------------------------------------------
// The scanner's own tests: what it must catch, and what it must let through.

#[test]
fn module_docs_are_detected() {
    assert!(opens_with_module_doc("//! The table.\nuse x;"));
    assert!(opens_with_module_doc("\n//! After a blank line.\n"));
    assert!(!opens_with_module_doc("/// An item doc.\nfn f() {}"));
    assert!(!opens_with_module_doc("use x;\n//! too late"));
    assert!(!opens_with_module_doc(""));
}

#[test]
fn the_layer_guard_catches_imports_that_climb() {
    let state = vec!["state".to_owned(), "cluster".to_owned()];
    let climbing = [
        "use crate::service::serve;",
        "use crate::{objects::translate, http::server::AppState};",
        "fn f() { crate::k8s::watch::Feed::new(); }",
        "use super::super::telemetry::Metrics;",
    ];
    let problems = |code: &str| -> Vec<String> {
        rooms_named(&state, code)
            .into_iter()
            .filter_map(|(_, target)| layer_violation("state", &target))
            .collect()
    };
    for code in climbing {
        assert!(!problems(code).is_empty(), "not caught: {code}");
    }
    let allowed = [
        "use gpu_engine::Table;\nuse super::policy::PolicyCell;",
        "use crate::objects::translate;\nuse crate::config::Config;",
        "//! Mentions crate::service in a comment.\nfn f() -> &'static str { \"crate::http\" }",
        "#[cfg(test)]\nmod tests {\n    use crate::service::serve;\n}",
        "#[cfg(test)]\nfn helper() { crate::http::server::router(); }\nfn kept() {}",
    ];
    for code in allowed {
        let found = problems(code);
        assert!(found.is_empty(), "flagged: {code}: {found:?}");
    }
    assert!(
        layer_violation("k8s", "http").is_some(),
        "rooms beside each other"
    );
    assert!(layer_violation("http", "state").is_none());
}
