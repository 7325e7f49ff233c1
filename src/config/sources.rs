//! Where a configuration comes from and how the sources merge: defaults, the YAML file, the
//! `GPU_EXTENDER_*` environment and dotted-key overrides, in that order of precedence.

use std::path::Path;

use serde_yaml_ng::{Mapping, Value};

use super::{Config, ConfigError, ENV_PREFIX, KEYS, RESERVED_ENV};

impl Config {
    /// Loads the configuration the way the binary does: defaults, then the file at `path` (if
    /// any), then the process's `GPU_EXTENDER_*` environment, then `flags` (dotted key, YAML
    /// value, and the flag it came from for messages), and validates the result.
    pub fn load(
        path: Option<&Path>,
        flags: &[(String, String, String)],
    ) -> Result<Self, ConfigError> {
        let text = match path {
            Some(path) => {
                Some(
                    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                        path: path.to_owned(),
                        source,
                    })?,
                )
            }
            None => None,
        };
        let name = path.map(|p| p.display().to_string()).unwrap_or_default();
        let env: Vec<(String, String)> = std::env::vars()
            .filter(|(name, _)| name.starts_with(ENV_PREFIX))
            .collect();
        Self::from_sources(
            text.as_deref().map(|text| (name.as_str(), text)),
            &env,
            flags,
        )
    }

    /// The pure core of [`Config::load`]: `file` is `(name for messages, YAML text)`, `env` the
    /// environment variables to consider (others are ignored), `flags` dotted-key overrides as
    /// `(key, value, origin)`, the origin naming the flag in messages (`flag --scoring`).
    pub fn from_sources(
        file: Option<(&str, &str)>,
        env: &[(String, String)],
        flags: &[(String, String, String)],
    ) -> Result<Self, ConfigError> {
        let mut config = match file {
            // An empty file (or one holding only comments) means "all defaults".
            Some((_, text)) if text.trim().is_empty() => Self::default(),
            Some((name, text)) => {
                let is_null = serde_yaml_ng::from_str::<Value>(text)
                    .map(|value| value.is_null())
                    .unwrap_or(false);
                if is_null {
                    Self::default()
                } else {
                    serde_yaml_ng::from_str(text).map_err(|e| ConfigError::Parse {
                        source_name: name.to_owned(),
                        message: e.to_string(),
                    })?
                }
            }
            None => Self::default(),
        };
        config = config.with_overrides(env_overrides(env)?.iter().chain(flags))?;
        config.validate()?;
        Ok(config)
    }

    /// This configuration with each `(key, value, origin)` set in turn ([`Config::with_override`]).
    pub fn with_overrides<'a>(
        self,
        overrides: impl IntoIterator<Item = &'a (String, String, String)>,
    ) -> Result<Self, ConfigError> {
        overrides
            .into_iter()
            .try_fold(self, |config, (key, value, origin)| {
                config.with_override(key, value, origin)
            })
    }

    /// This configuration with one key set. `value` is read as YAML; if that does not fit the
    /// key's type, as a plain string (so `urlPrefix=123` means the string "123").
    pub fn with_override(self, key: &str, value: &str, origin: &str) -> Result<Self, ConfigError> {
        if !KEYS.contains(&key) {
            return Err(ConfigError::UnknownKey {
                key: key.to_owned(),
                origin: origin.to_owned(),
            });
        }
        let error = |message: String| ConfigError::Override {
            key: key.to_owned(),
            origin: origin.to_owned(),
            message,
        };
        let tree = serde_yaml_ng::to_value(&self).map_err(|e| error(e.to_string()))?;
        let parsed = serde_yaml_ng::from_str::<Value>(value).unwrap_or(Value::Null);
        let first = set_path(tree.clone(), key, parsed.clone()).and_then(from_tree);
        match first {
            Ok(config) => Ok(config),
            Err(first_error) => {
                let as_string = Value::String(value.to_owned());
                if parsed == as_string {
                    return Err(error(first_error));
                }
                set_path(tree, key, as_string)
                    .and_then(from_tree)
                    .map_err(|_| error(first_error))
            }
        }
    }
}

/// The environment variable that overrides `key`: `policy.maxPodsPerSharedGpu` →
/// `GPU_EXTENDER_POLICY_MAX_PODS_PER_SHARED_GPU`.
pub fn env_var_name(key: &str) -> String {
    let mut name = String::from(ENV_PREFIX);
    for (i, segment) in key.split('.').enumerate() {
        if i > 0 {
            name.push('_');
        }
        for (j, c) in segment.chars().enumerate() {
            if c.is_ascii_uppercase() && j > 0 {
                name.push('_');
            }
            name.push(c.to_ascii_uppercase());
        }
    }
    name
}

/// Every overridable key with its environment variable, in [`KEYS`] order.
pub fn env_vars() -> Vec<(String, &'static str)> {
    KEYS.iter().map(|key| (env_var_name(key), *key)).collect()
}

/// Picks the configuration overrides out of environment variables: `(key, value, origin)` for
/// each `GPU_EXTENDER_*` variable, in [`KEYS`] order (so the result does not depend on the
/// environment's order). Variables without the prefix are ignored; an unknown one with the
/// prefix is an error (a typo would otherwise be silently ignored), except [`RESERVED_ENV`].
pub fn env_overrides(
    env: &[(String, String)],
) -> Result<Vec<(String, String, String)>, ConfigError> {
    let known = env_vars();
    for (name, _) in env {
        let ours = name.starts_with(ENV_PREFIX);
        let reserved = RESERVED_ENV.contains(&name.as_str());
        if ours && !reserved && !known.iter().any(|(var, _)| var == name) {
            return Err(ConfigError::UnknownEnv(name.clone()));
        }
    }
    Ok(known
        .into_iter()
        .filter_map(|(var, key)| {
            env.iter()
                .rev() // the last definition wins, as in a shell
                .find(|(name, _)| *name == var)
                .map(|(_, value)| (key.to_owned(), value.clone(), format!("env {var}")))
        })
        .collect())
}

/// Splits a `KEY=VALUE` flag argument.
pub fn parse_override(arg: &str) -> Result<(String, String), ConfigError> {
    match arg.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => {
            Ok((key.trim().to_owned(), value.to_owned()))
        }
        _ => Err(ConfigError::MalformedOverride(arg.to_owned())),
    }
}

fn from_tree(tree: Value) -> Result<Config, String> {
    serde_yaml_ng::from_value(tree).map_err(|e| e.to_string())
}

fn set_path(mut tree: Value, key: &str, value: Value) -> Result<Value, String> {
    let segments: Vec<&str> = key.split('.').collect();
    let mut node = &mut tree;
    for (i, segment) in segments.iter().enumerate() {
        if node.is_null() {
            *node = Value::Mapping(Mapping::new());
        }
        let Value::Mapping(map) = node else {
            return Err(format!("{} is not a section", segments[..i].join(".")));
        };
        let slot = Value::String((*segment).to_owned());
        if i + 1 == segments.len() {
            map.insert(slot, value);
            return Ok(tree);
        }
        node = map.entry(slot).or_insert(Value::Null);
    }
    Ok(tree)
}
