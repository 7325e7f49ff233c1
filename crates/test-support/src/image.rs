//! The container image as its build files describe it, for the tests that hold the image, the
//! manifests and the crate to one another: the Dockerfile's instructions ([`Dockerfile`]) and
//! the build context `.dockerignore` lets through ([`build_context`]), with Docker's matching
//! rules for the patterns such a file uses.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// One instruction: its keyword (upper case) and its arguments, continuation lines joined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instruction {
    pub keyword: String,
    pub args: String,
}

/// A Dockerfile's instructions, in order, with the index of the stage each belongs to.
#[derive(Clone, Debug, Default)]
pub struct Dockerfile {
    pub instructions: Vec<(usize, Instruction)>,
}

impl Dockerfile {
    /// Reads Dockerfile text: comments and parser directives dropped, `\` continuations joined.
    pub fn parse(text: &str) -> Self {
        let mut instructions = Vec::new();
        let mut stage = 0usize;
        let mut seen_from = false;
        let mut pending = String::new();
        for line in text.lines() {
            let trimmed = line.trim();
            if pending.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
                continue;
            }
            if trimmed.starts_with('#') {
                // A comment inside a continued instruction.
                continue;
            }
            if let Some(head) = trimmed.strip_suffix('\\') {
                pending.push_str(head);
                pending.push(' ');
                continue;
            }
            pending.push_str(trimmed);
            let whole = std::mem::take(&mut pending);
            let (keyword, args) = whole
                .split_once(char::is_whitespace)
                .unwrap_or((&whole, ""));
            let keyword = keyword.to_ascii_uppercase();
            if keyword == "FROM" {
                if seen_from {
                    stage += 1;
                }
                seen_from = true;
            }
            instructions.push((
                stage,
                Instruction {
                    keyword,
                    args: args.trim().to_owned(),
                },
            ));
        }
        Self { instructions }
    }

    /// The index of the last stage: the one the image is.
    pub fn final_stage(&self) -> usize {
        self.instructions.last().map_or(0, |(stage, _)| *stage)
    }

    /// The arguments of every `keyword` instruction of `stage`, in order.
    pub fn in_stage<'a>(&'a self, stage: usize, keyword: &str) -> impl Iterator<Item = &'a str> {
        let keyword = keyword.to_owned();
        self.instructions
            .iter()
            .filter(move |(s, i)| *s == stage && i.keyword == keyword)
            .map(|(_, i)| i.args.as_str())
    }

    /// The last `keyword` of the final stage (USER, ENTRYPOINT, CMD: the last one counts).
    pub fn last_final(&self, keyword: &str) -> Option<&str> {
        self.in_stage(self.final_stage(), keyword).last()
    }

    /// ENTRYPOINT or CMD in exec form (a JSON array), as the image's config records it.
    pub fn exec_form(&self, keyword: &str) -> Result<Vec<String>> {
        let args = self
            .last_final(keyword)
            .with_context(|| format!("the final stage has no {keyword}"))?;
        serde_json::from_str(args)
            .with_context(|| format!("{keyword} {args} is not in exec form (a JSON array)"))
    }

    /// The ports the final stage exposes (`EXPOSE 8888 9090/tcp`).
    pub fn exposed_ports(&self) -> Vec<u16> {
        self.in_stage(self.final_stage(), "EXPOSE")
            .flat_map(str::split_whitespace)
            .filter_map(|port| port.split('/').next()?.parse().ok())
            .collect()
    }

    /// The context paths the build stages copy (`COPY a b ./dest`, without `--from`): every
    /// source, as written.
    pub fn context_sources(&self) -> Vec<String> {
        self.instructions
            .iter()
            .filter(|(_, i)| i.keyword == "COPY" || i.keyword == "ADD")
            .filter(|(_, i)| !i.args.contains("--from="))
            .flat_map(|(_, i)| {
                let words: Vec<&str> = i
                    .args
                    .split_whitespace()
                    .filter(|w| !w.starts_with("--"))
                    .collect();
                let sources = words.len().saturating_sub(1);
                words[..sources]
                    .iter()
                    .map(|w| (*w).to_owned())
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

/// One `.dockerignore` rule: a pattern, and whether it lets paths back in (`!`).
#[derive(Clone, Debug)]
struct Rule {
    segments: Vec<String>,
    include: bool,
}

/// Docker's `.dockerignore` matching for the patterns such a file uses: `/`-separated segments
/// matched with `*` and `?` inside one segment, `**` across any number of them; the last rule
/// that matches a path decides; a rule that matches a directory covers everything under it.
fn rules(text: &str) -> Vec<Rule> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let (include, pattern) = match line.strip_prefix('!') {
                Some(rest) => (true, rest.trim()),
                None => (false, line),
            };
            let pattern = pattern.trim_start_matches("./").trim_matches('/');
            Rule {
                segments: pattern.split('/').map(str::to_owned).collect(),
                include,
            }
        })
        .collect()
}

fn segment_matches(pattern: &str, name: &str) -> bool {
    fn go(p: &[char], n: &[char]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some('*'), _) => go(&p[1..], n) || (!n.is_empty() && go(p, &n[1..])),
            (Some('?'), Some(_)) => go(&p[1..], &n[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &n[1..]),
            _ => false,
        }
    }
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    go(&p, &n)
}

/// Whether `pattern` matches `path` or one of the directories above it.
fn rule_matches(pattern: &[String], path: &[&str]) -> bool {
    fn go(p: &[String], n: &[&str]) -> bool {
        match p.first() {
            None => true, // the pattern matched a directory above the path: it covers it
            Some(seg) if seg == "**" => (0..=n.len()).any(|skip| go(&p[1..], &n[skip..])),
            Some(seg) => !n.is_empty() && segment_matches(seg, n[0]) && go(&p[1..], &n[1..]),
        }
    }
    go(pattern, path)
}

/// Whether `.dockerignore`'s rules (its text) send `path` (relative, `/`-separated) to the builder.
pub fn sent(dockerignore: &str, path: &str) -> bool {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let mut included = true;
    for rule in rules(dockerignore) {
        if rule_matches(&rule.segments, &segments) {
            included = rule.include;
        }
    }
    included
}

/// Every file under `root` that `root/.dockerignore` sends to the builder, relative to `root`,
/// sorted. `.git` and what git ignores in the clone would be sent if the rules let them: they
/// are listed as any other file.
pub fn build_context(root: &Path) -> Result<Vec<PathBuf>> {
    let ignore = std::fs::read_to_string(root.join(".dockerignore")).unwrap_or_default();
    let mut files = Vec::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(dir) = pending.pop() {
        let entries = std::fs::read_dir(root.join(&dir))
            .with_context(|| format!("reading {}", root.join(&dir).display()))?;
        for entry in entries {
            let entry = entry?;
            let relative = dir.join(entry.file_name());
            let kind = entry.file_type()?;
            if kind.is_dir() {
                pending.push(relative);
            } else if sent(&ignore, &relative.to_string_lossy()) {
                files.push(relative);
            }
        }
    }
    files.sort();
    Ok(files)
}

/// Copies the build context of `root` into `dest` (created), as the builder receives it.
pub fn copy_context(root: &Path, dest: &Path) -> Result<Vec<PathBuf>> {
    let files = build_context(root)?;
    if files.is_empty() {
        bail!("{}/.dockerignore lets nothing through", root.display());
    }
    for file in &files {
        let target = dest.join(file);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        let source = root.join(file);
        std::fs::copy(&source, &target).with_context(|| format!("copying {}", file.display()))?;
        // The source's time, so that cargo finds an earlier check of the same files fresh.
        let modified = std::fs::metadata(&source)
            .and_then(|meta| meta.modified())
            .with_context(|| format!("reading the time of {}", file.display()))?;
        std::fs::File::options()
            .write(true)
            .open(&target)
            .and_then(|copy| copy.set_modified(modified))
            .with_context(|| format!("setting the time of {}", target.display()))?;
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dockerignore_rules_decide_by_the_last_match_and_cover_directories() {
        let rules = "# c\n*\n!Cargo.toml\n!src/\n!crates/\ncrates/**/target\n!docs/*.md\n";
        assert!(sent(rules, "Cargo.toml"));
        assert!(sent(rules, "src/lib.rs"));
        assert!(sent(rules, "src/http/ui/app.js"));
        assert!(!sent(rules, "scheduler-config/x.yaml"));
        assert!(!sent(rules, "Cargo.lock"));
        assert!(!sent(rules, "crates/engine/target/x"));
        assert!(sent(rules, "crates/engine/src/lib.rs"));
        assert!(sent(rules, "docs/a.md"));
        assert!(!sent(rules, "docs/a/b.md"));
        assert!(sent("", "anything/at/all"));
        assert!(segment_matches("*.rs", "lib.rs") && !segment_matches("*.rs", "lib.rsx"));
    }

    #[test]
    fn dockerfile_instructions_stages_and_exec_forms() {
        let text = "# syntax=docker/dockerfile:1\nARG V=1\nFROM rust AS b\nCOPY a b ./\nRUN x \\\n  # note\n  && y\nFROM base\nCOPY --from=b /out/x /x\nUSER 1:2\nEXPOSE 80 9090/tcp\nENTRYPOINT [\"/x\"]\nCMD [\"serve\"]\n";
        let file = Dockerfile::parse(text);
        assert_eq!(file.final_stage(), 1);
        assert_eq!(file.last_final("USER"), Some("1:2"));
        assert_eq!(file.exposed_ports(), vec![80, 9090]);
        assert_eq!(file.exec_form("ENTRYPOINT").unwrap(), vec!["/x"]);
        assert_eq!(file.exec_form("CMD").unwrap(), vec!["serve"]);
        assert_eq!(file.context_sources(), vec!["a", "b"]);
        assert_eq!(file.in_stage(0, "RUN").collect::<Vec<_>>(), vec!["x  && y"]);
    }
}
