//! The command-line side of configuration: the flags every command that reads it takes, and
//! `serve`'s shortcuts, turned into dotted-key overrides.

use std::path::PathBuf;

use gpu_engine::ScoringPolicy;

use super::{Config, ConfigError, parse_override};

/// Command-line flags for the configuration that every command reading it takes (`serve`,
/// `check-config`, `inspect`, `explain`): the file, the scoring policy, and `--set key=value`
/// for any key. `serve` adds its own shortcuts, [`ServeFlags`].
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ConfigFlags {
    /// YAML configuration file (see docs/configuration.md).
    #[arg(long = "config", env = "GPU_EXTENDER_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Node scoring policy (policy.scoring).
    #[arg(long, value_name = "POLICY", value_parser = scoring_names())]
    pub scoring: Option<String>,
    /// Set any configuration key, e.g. --set policy.maxPodsPerSharedGpu=10 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

/// `--scoring`'s possible values, from the engine's list of policies (so help and errors list
/// them all).
fn scoring_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(ScoringPolicy::ALL.map(ScoringPolicy::as_str))
}

/// `serve`'s shortcut flags for keys only the running service uses: its listeners and what it
/// writes at bind time. Every one of them can also be set with `--set`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ServeFlags {
    /// Extender listen address (server.listen).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Admin listen address for healthz/readyz/metrics/inspect and the web view /ui (server.adminListen).
    #[arg(long, value_name = "ADDR")]
    pub admin_listen: Option<String>,
    /// Path prefix of the extender verbs (server.urlPrefix).
    #[arg(long, value_name = "PATH")]
    pub url_prefix: Option<String>,
    /// Write the gpushare device plugin's annotations: true or false (gpushare.enabled).
    #[arg(long, value_name = "BOOL")]
    pub gpushare: Option<String>,
}

/// `KEY=VALUE` arguments of the flag `flag` (`--set`, or the replay's `--extender-set`) as
/// overrides `(key, value, origin)`, the origin naming the flag and key in messages.
pub fn set_overrides(
    args: &[String],
    flag: &str,
) -> Result<Vec<(String, String, String)>, ConfigError> {
    args.iter()
        .map(|arg| {
            let (key, value) = parse_override(arg)?;
            let origin = format!("flag {flag} {key}");
            Ok((key, value, origin))
        })
        .collect()
}

/// The overrides of the shortcut flags given: `(key, value, origin)`, the origin naming the
/// flag the user typed.
fn shortcut_overrides(
    shortcuts: &[(&str, &str, &Option<String>)],
) -> Vec<(String, String, String)> {
    shortcuts
        .iter()
        .filter_map(|(flag, key, value)| {
            value
                .as_ref()
                .map(|v| ((*key).to_owned(), v.clone(), format!("flag --{flag}")))
        })
        .collect()
}

impl ServeFlags {
    /// The flags as dotted-key overrides, in the form [`ConfigFlags::load_with`] takes.
    pub fn overrides(&self) -> Vec<(String, String, String)> {
        shortcut_overrides(&[
            ("listen", "server.listen", &self.listen),
            ("admin-listen", "server.adminListen", &self.admin_listen),
            ("url-prefix", "server.urlPrefix", &self.url_prefix),
            ("gpushare", "gpushare.enabled", &self.gpushare),
        ])
    }
}

impl ConfigFlags {
    /// The flags as dotted-key overrides `(key, value, origin)`, after `earlier` (a command's
    /// own shortcuts), `--set` last so it wins.
    pub fn overrides(
        &self,
        earlier: Vec<(String, String, String)>,
    ) -> Result<Vec<(String, String, String)>, ConfigError> {
        let mut overrides = earlier;
        overrides.extend(shortcut_overrides(&[(
            "scoring",
            "policy.scoring",
            &self.scoring,
        )]));
        overrides.extend(set_overrides(&self.set, "--set")?);
        Ok(overrides)
    }

    /// Loads the configuration from the file, the environment and these flags.
    pub fn load(&self) -> Result<Config, ConfigError> {
        self.load_with(Vec::new())
    }

    /// [`ConfigFlags::load`] with a command's own shortcut overrides (`serve`'s
    /// [`ServeFlags::overrides`]) applied before these flags.
    pub fn load_with(&self, earlier: Vec<(String, String, String)>) -> Result<Config, ConfigError> {
        Config::load(self.config.as_deref(), &self.overrides(earlier)?)
    }
}
