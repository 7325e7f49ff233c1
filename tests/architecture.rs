//! Architecture guard: the engine stays pure, and every module says what it is.
//!
//! `src/engine` must not name an I/O, async, HTTP, Kubernetes, metrics, logging or randomness
//! crate, read the clock, touch files, sockets, threads, the environment or locks, or print. The
//! guard reads the source text: comments and string literals are removed first, `use` trees are
//! expanded to full paths, and every path and identifier is checked. The scanner's own tests at
//! the bottom show what it catches and what it lets through.
//!
//! Every `.rs` file under `src/` must open with a `//!` line saying what it owns.
//!
//! The rooms of `src/` (its top-level modules) are layered ([`LAYERS`]): a room imports only
//! rooms below it, never one beside or above it, outside its `#[cfg(test)]` code. Cycles between
//! modules inside a room are found by `scripts/module-graph.sh` (cargo-modules, in `make lint`);
//! see docs/decisions/0007-one-room-for-shared-state.md.

use std::fs;
use std::path::{Path, PathBuf};

/// Crates the engine must never name: I/O, async, HTTP, Kubernetes, metrics, logging, randomness,
/// locks.
const FORBIDDEN_CRATES: &[&str] = &[
    "tokio",
    "axum",
    "hyper",
    "hyper_util",
    "tower",
    "tower_http",
    "reqwest",
    "futures",
    "async_std",
    "kube",
    "kube_client",
    "kube_runtime",
    "k8s_openapi",
    "prometheus",
    "tracing",
    "tracing_subscriber",
    "log",
    "env_logger",
    "rand",
    "rand_core",
    "rand_chacha",
    "getrandom",
    "fastrand",
    "dashmap",
    "parking_lot",
];

/// Modules of `std` (and `core`/`alloc`) that do I/O, read the clock, spawn or read the
/// environment.
const FORBIDDEN_STD_MODULES: &[&str] = &["fs", "net", "io", "time", "thread", "env", "process"];

/// `std::sync` items that lock or block.
const FORBIDDEN_SYNC_ITEMS: &[&str] = &["Mutex", "RwLock", "Condvar", "Barrier", "mpsc"];

/// Identifiers that mean the clock or a lock wherever they come from.
const FORBIDDEN_IDENTS: &[&str] = &["SystemTime", "Instant", "Mutex", "RwLock", "UNIX_EPOCH"];

/// Macros that write to stdout/stderr.
const FORBIDDEN_MACROS: &[&str] = &["println", "eprintln", "print", "eprint", "dbg"];

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

#[test]
fn the_engine_does_no_io_async_clock_randomness_locks_or_logging() {
    let files = rust_files(&src().join("engine"));
    assert!(
        files.iter().any(|f| f.ends_with("fit.rs")) && files.len() >= 10,
        "the guard found too few engine files: {files:?}"
    );
    let mut violations = Vec::new();
    for file in &files {
        for found in impurities(&read(file)) {
            violations.push(format!("{}: {found}", file.display()));
        }
    }
    assert!(
        violations.is_empty(),
        "the engine must stay pure:\n{}",
        violations.join("\n")
    );
}

#[test]
fn every_module_opens_with_a_doc_line() {
    let files = rust_files(&src());
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

/// The rooms of `src/`, lowest layer first. A room may import the rooms of lower layers only:
/// the engine nothing; the readers of the engine's values (configuration, the explanation and
/// inspection reports, the simulator) the engine; the Kubernetes-object translation those; the
/// shared state (table, policy in force, readiness, the verbs' decisions) everything below it;
/// the metrics the state; the watchers and binder (`k8s`) and the extender's HTTP surface
/// (`http`) and the scheduler-estimator (`estimator`) the state and the metrics but not each
/// other; the composition (`service`) and the
/// operator commands (`cli`, `replay`) whatever they wire together.
const LAYERS: &[&[&str]] = &[
    &["engine"],
    &["config", "explain", "inspect", "sim"],
    &["objects"],
    &["state"],
    &["telemetry"],
    &["k8s", "http", "estimator"],
    &["service", "cli", "replay"],
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

/// Everything forbidden that `source` names, one line each.
fn impurities(source: &str) -> Vec<String> {
    let tokens = tokens(&strip_comments_and_literals(source));
    let mut found = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let token = tokens[i].as_str();
        let is_extern_crate = token == "extern" && tokens.get(i + 1).is_some_and(|t| t == "crate");
        if token == "use" || is_extern_crate {
            let start = if token == "use" { i + 1 } else { i + 2 };
            let end = tokens[start..]
                .iter()
                .position(|t| t == ";")
                .map_or(tokens.len(), |p| start + p);
            for path in expand_use_tree(&tokens[start..end]) {
                check_path(&path, true, &mut found);
            }
            i = end + 1;
            continue;
        }
        if token == "async" || token == "await" {
            found.push(format!("`{token}`: the engine is synchronous"));
        }
        if !is_ident(token) {
            i += 1;
            continue;
        }
        if FORBIDDEN_IDENTS.contains(&token) {
            found.push(format!(
                "`{token}`: the engine reads no clock and takes no lock"
            ));
        }
        if FORBIDDEN_MACROS.contains(&token) && tokens.get(i + 1).is_some_and(|t| t == "!") {
            found.push(format!("`{token}!`: the engine does not print"));
        }
        // A path in code: ident (:: ident)*. One that continues an earlier `::` (as in
        // `::std::fs`) starts at its first identifier all the same.
        let mut path = vec![token.to_owned()];
        let mut j = i + 1;
        while tokens.get(j).is_some_and(|t| t == "::")
            && tokens.get(j + 1).is_some_and(|t| is_ident(t))
        {
            path.push(tokens[j + 1].clone());
            j += 2;
        }
        check_path(&path, false, &mut found);
        i = j;
    }
    found.sort();
    found.dedup();
    found
}

/// Checks one path. A forbidden crate is reported when it is imported (`use tokio;`,
/// `extern crate log;`) or used through a path (`tracing::info!`); a lone identifier in code
/// that happens to share a crate's name (a variable `log`) is not a use of the crate.
fn check_path(segments: &[String], imported: bool, found: &mut Vec<String>) {
    let Some(first) = segments.first().map(String::as_str) else {
        return;
    };
    let path = segments.join("::");
    if FORBIDDEN_CRATES.contains(&first) && (imported || segments.len() >= 2) {
        found.push(format!(
            "`{path}`: the engine names no I/O or service crate"
        ));
        return;
    }
    if matches!(first, "std" | "core" | "alloc") {
        match segments.get(1).map(String::as_str) {
            Some(module) if FORBIDDEN_STD_MODULES.contains(&module) => {
                found.push(format!(
                    "`{path}`: the engine does no I/O and reads no clock"
                ));
            }
            Some("sync") => {
                if let Some(item) = segments.get(2)
                    && FORBIDDEN_SYNC_ITEMS.contains(&item.as_str())
                {
                    found.push(format!("`{path}`: the engine takes no lock"));
                }
            }
            _ => {}
        }
    }
}

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
fn the_scanner_catches_impure_code() {
    let impure = [
        "use tokio::sync::mpsc;",
        "use std::fs;",
        "use std::{collections::HashMap, fs::File};",
        "use std::sync::{Arc, Mutex};",
        "use std::sync::RwLock as Lock;",
        "use ::std::time::Duration;",
        "use std::io::{self, Write};",
        "use std::net::TcpStream;",
        "use std::thread;",
        "use std::env::var;",
        "use rand::Rng;",
        "use tracing;",
        "extern crate log;",
        "fn f() { let t = std::time::Instant::now(); }",
        "fn f() { let t = SystemTime::now(); }",
        "fn f() { tracing::info!(\"x\"); }",
        "fn f() { log::warn!(\"x\"); }",
        "fn f() -> kube::Client { todo!() }",
        "fn f(x: k8s_openapi::api::core::v1::Pod) {}",
        "fn f() { prometheus::register(); }",
        "fn f() { hyper::body(); axum::serve(); }",
        "async fn f() {}",
        "fn f() { g().await }",
        "fn f() { println!(\"{}\", 1); }",
        "fn f() { dbg!(1); }",
        "fn f() { std::env::var(\"HOME\"); }",
        "fn f(m: &Mutex<u8>) {}",
    ];
    for code in impure {
        assert!(!impurities(code).is_empty(), "not caught: {code}");
    }
}

#[test]
fn the_scanner_lets_pure_code_through() {
    let pure = [
        "//! Talks about tokio, std::fs and Instant in a comment only.\nuse std::sync::Arc;",
        "use std::collections::{BTreeSet, HashMap};",
        "use std::fmt;\nuse std::cmp::Ordering;",
        "use super::model::{MemMiB, NodeName};",
        "use crate::engine::topology::positions;",
        "fn f() -> &'static str { \"std::fs::read and tokio::spawn in a string\" }",
        "fn f() -> char { 'x' }\nfn g<'a>(s: &'a str) -> &'a str { s }",
        "fn catalog(logs: u32, timer: u32, random: u32) -> u32 { logs + timer + random }",
        "/* block comment: use std::io; */ fn f() {}",
        "fn f() -> String { r#\"use std::net; \"quoted\"\"#.to_owned() }",
        "fn f(time: u64, log: u64) -> u64 { time + log }",
        "use thiserror::Error;",
    ];
    for code in pure {
        assert_eq!(impurities(code), Vec::<String>::new(), "flagged: {code}");
    }
}

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
        "use crate::{engine::Table, http::server::AppState};",
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
        "use crate::engine::Table;\nuse super::policy::PolicyCell;",
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
