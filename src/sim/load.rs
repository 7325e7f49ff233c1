//! Reading clusters and workloads from files: the openb trace CSVs and our own YAML scenario
//! format, chosen by extension. Every malformed input becomes a [`LoadError`] that names the
//! file and the line (CSV) or entry (YAML); nothing here panics on input.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use thiserror::Error;

use super::trace::{Cluster, SimNode, SimPod, Workload};
use crate::engine::{CpuMilli, MemMiB, ModelPattern, WHOLE_GPU_COMPUTE};

/// The most GPUs one node (or pod) may have: the engine's GPU sets are 64-bit masks.
const MAX_GPUS: u64 = 64;

/// Why a file could not be loaded.
#[derive(Debug, Error)]
pub enum LoadError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: the header has no {column:?} column (it has: {found})")]
    MissingColumn {
        path: PathBuf,
        column: &'static str,
        found: String,
    },
    #[error("{path}:{line}: {message}")]
    Row {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{path}: not a valid scenario file")]
    Yaml {
        path: PathBuf,
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error("{path}: {section}[{index}] ({name}): {message}")]
    Entry {
        path: PathBuf,
        section: &'static str,
        index: usize,
        name: String,
        message: String,
    },
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
}

/// Reads a node list: `.yaml`/`.yml` in our scenario format (its `nodes`), anything else as an
/// openb node CSV.
pub fn load_cluster(path: &Path) -> Result<Cluster, LoadError> {
    let text = read(path)?;
    let name = stem(path);
    if is_yaml(path) {
        let scenario = parse_scenario(path, &text)?;
        return scenario.cluster.ok_or_else(|| LoadError::File {
            path: path.to_owned(),
            message: "the scenario has no nodes".to_owned(),
        });
    }
    parse_node_csv(path, &text).map(|nodes| Cluster::new(name, nodes))
}

/// Reads a pod list: `.yaml`/`.yml` in our scenario format (its `pods`), anything else as an
/// openb pod CSV. The workload is named after the file (`openb_pod_list_default.csv` →
/// `default`).
pub fn load_workload(path: &Path) -> Result<Workload, LoadError> {
    let text = read(path)?;
    if is_yaml(path) {
        let scenario = parse_scenario(path, &text)?;
        return scenario.workload.ok_or_else(|| LoadError::File {
            path: path.to_owned(),
            message: "the scenario has no pods".to_owned(),
        });
    }
    let name = stem(path);
    let name = name
        .strip_prefix("openb_pod_list_")
        .map(str::to_owned)
        .unwrap_or(name);
    parse_pod_csv(path, &text).map(|pods| Workload::new(name, pods))
}

/// A scenario file's contents: either part may be absent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scenario {
    pub cluster: Option<Cluster>,
    pub workload: Option<Workload>,
}

/// Reads a YAML scenario (nodes and/or pods).
pub fn load_scenario(path: &Path) -> Result<Scenario, LoadError> {
    parse_scenario(path, &read(path)?)
}

fn read(path: &Path) -> Result<String, LoadError> {
    std::fs::read_to_string(path).map_err(|source| LoadError::Read {
        path: path.to_owned(),
        source,
    })
}

fn is_yaml(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml")
    )
}

fn stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// openb CSV

/// A parsed CSV: column positions by name, and data rows with their 1-based line numbers.
struct Csv<'a> {
    path: &'a Path,
    columns: HashMap<String, usize>,
    header: Vec<String>,
    rows: Vec<(usize, Vec<String>)>,
}

impl<'a> Csv<'a> {
    fn parse(path: &'a Path, text: &str) -> Result<Self, LoadError> {
        let mut lines = text
            .lines()
            .enumerate()
            .map(|(i, line)| (i + 1, line.trim_end_matches('\r')))
            .filter(|(_, line)| !line.trim().is_empty());
        let Some((header_line, header)) = lines.next() else {
            return Err(LoadError::File {
                path: path.to_owned(),
                message: "the file is empty (expected a header line)".to_owned(),
            });
        };
        let header: Vec<String> = split_fields(header)
            .map_err(|message| row_error(path, header_line, message))?
            .into_iter()
            .map(|h| h.trim().to_owned())
            .collect();
        let columns = header
            .iter()
            .enumerate()
            .map(|(i, h)| (h.clone(), i))
            .collect();
        let mut rows = Vec::new();
        for (line, text) in lines {
            let fields = split_fields(text).map_err(|message| row_error(path, line, message))?;
            if fields.len() != header.len() {
                return Err(row_error(
                    path,
                    line,
                    format!(
                        "expected {} fields like the header, found {}",
                        header.len(),
                        fields.len()
                    ),
                ));
            }
            rows.push((line, fields));
        }
        Ok(Self {
            path,
            columns,
            header,
            rows,
        })
    }

    /// The position of the first of `names` that the header has.
    fn column(&self, names: &[&'static str]) -> Result<usize, LoadError> {
        names
            .iter()
            .find_map(|name| self.columns.get(*name).copied())
            .ok_or_else(|| LoadError::MissingColumn {
                path: self.path.to_owned(),
                column: names[0],
                found: self.header.join(","),
            })
    }

    fn optional_column(&self, name: &str) -> Option<usize> {
        self.columns.get(name).copied()
    }
}

/// Splits one CSV line. Fields may be quoted (`"a,b"`, with `""` for a quote inside).
fn split_fields(line: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    let mut at_start = true;
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted => {
                if chars.peek() == Some(&'"') {
                    chars.next();
                    field.push('"');
                } else {
                    quoted = false;
                }
            }
            '"' if at_start => quoted = true,
            ',' if !quoted => {
                fields.push(std::mem::take(&mut field));
                at_start = true;
                continue;
            }
            other => field.push(other),
        }
        at_start = false;
    }
    if quoted {
        return Err("a quoted field is not closed".to_owned());
    }
    fields.push(field);
    Ok(fields)
}

fn row_error(path: &Path, line: usize, message: impl Into<String>) -> LoadError {
    LoadError::Row {
        path: path.to_owned(),
        line,
        message: message.into(),
    }
}

fn whole_number(value: &str, column: &str) -> Result<u64, String> {
    value
        .trim()
        .parse::<u64>()
        .map_err(|_| format!("{column} {value:?} is not a whole number"))
}

fn gpu_count(value: u64, column: &str) -> Result<u16, String> {
    if value > MAX_GPUS {
        return Err(format!(
            "{column} {value} is more than the {MAX_GPUS} GPUs one node can have"
        ));
    }
    Ok(value as u16)
}

/// Parses `A|B|C` into model patterns (empty = any model).
pub(crate) fn model_list(value: &str) -> Result<Vec<ModelPattern>, String> {
    value
        .split('|')
        .map(str::trim)
        .filter(|model| !model.is_empty())
        .map(|model| ModelPattern::parse(model).map_err(|e| e.to_string()))
        .collect()
}

/// Parses an openb node list (`sn,cpu_milli,memory_mib,gpu,model`; `name` may replace `sn`).
pub fn parse_node_csv(path: &Path, text: &str) -> Result<Vec<SimNode>, LoadError> {
    let csv = Csv::parse(path, text)?;
    let name = csv.column(&["sn", "name"])?;
    let cpu = csv.column(&["cpu_milli"])?;
    let memory = csv.column(&["memory_mib"])?;
    let gpu = csv.column(&["gpu", "num_gpu"])?;
    let model = csv.column(&["model"])?;
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut nodes = Vec::with_capacity(csv.rows.len());
    for (line, fields) in &csv.rows {
        let line = *line;
        let node = (|| -> Result<SimNode, String> {
            let name = fields[name].trim().to_owned();
            if name.is_empty() {
                return Err("the node name is empty".to_owned());
            }
            let gpus = gpu_count(whole_number(&fields[gpu], "gpu")?, "gpu")?;
            let model = fields[model].trim().to_owned();
            if gpus > 0 && model.is_empty() {
                return Err(format!("node {name} has {gpus} GPUs but no model"));
            }
            Ok(SimNode {
                name,
                cpu: CpuMilli(whole_number(&fields[cpu], "cpu_milli")?),
                memory: MemMiB(whole_number(&fields[memory], "memory_mib")?),
                gpus,
                model,
            })
        })()
        .map_err(|message| row_error(path, line, message))?;
        if let Some(first) = seen.insert(node.name.clone(), line) {
            return Err(row_error(
                path,
                line,
                format!("node {} is listed twice (first on line {first})", node.name),
            ));
        }
        nodes.push(node);
    }
    if nodes.is_empty() {
        return Err(LoadError::File {
            path: path.to_owned(),
            message: "no nodes".to_owned(),
        });
    }
    Ok(nodes)
}

/// Parses an openb pod list (`name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]`).
/// Other columns (qos, phases, timestamps) are ignored, as the reference ignores them;
/// `gpu_milli` is clipped to 0..=1000 as the reference's converter does.
pub fn parse_pod_csv(path: &Path, text: &str) -> Result<Vec<SimPod>, LoadError> {
    let csv = Csv::parse(path, text)?;
    let name = csv.column(&["name"])?;
    let cpu = csv.column(&["cpu_milli"])?;
    let memory = csv.column(&["memory_mib"])?;
    let num_gpu = csv.column(&["num_gpu"])?;
    let gpu_milli = csv.column(&["gpu_milli"])?;
    let gpu_spec = csv.optional_column("gpu_spec");
    let mut pods = Vec::with_capacity(csv.rows.len());
    for (line, fields) in &csv.rows {
        let pod = (|| -> Result<SimPod, String> {
            let name = fields[name].trim().to_owned();
            if name.is_empty() {
                return Err("the pod name is empty".to_owned());
            }
            let milli_raw = fields[gpu_milli].trim();
            let milli = milli_raw
                .parse::<i64>()
                .map_err(|_| format!("gpu_milli {milli_raw:?} is not a whole number"))?
                .clamp(0, i64::from(WHOLE_GPU_COMPUTE.0)) as u32;
            let spec = gpu_spec.map_or("", |column| fields[column].trim());
            Ok(SimPod {
                name,
                cpu: CpuMilli(whole_number(&fields[cpu], "cpu_milli")?),
                memory: MemMiB(whole_number(&fields[memory], "memory_mib")?),
                gpus: gpu_count(whole_number(&fields[num_gpu], "num_gpu")?, "num_gpu")?,
                milli,
                gpu_spec: spec.to_owned(),
                models: model_list(spec).map_err(|e| format!("gpu_spec: {e}"))?,
            })
        })()
        .map_err(|message| row_error(path, *line, message))?;
        pods.push(pod);
    }
    Ok(pods)
}

// ---------------------------------------------------------------------------------------------
// YAML scenario

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScenarioFile {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    nodes: Option<Vec<Group>>,
    #[serde(default)]
    pods: Option<Vec<Group>>,
}

/// One entry of `nodes` or `pods`: `count` copies of a node or a pod. `model` belongs to nodes,
/// `gpu_milli` and `models` to pods; the section reader rejects the other side's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Group {
    name: String,
    #[serde(default = "one")]
    count: u32,
    cpu_milli: u64,
    memory_mib: u64,
    #[serde(default)]
    gpus: u64,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    gpu_milli: Option<u32>,
    #[serde(default)]
    models: Option<Vec<String>>,
}

fn one() -> u32 {
    1
}

/// Names for `count` copies of a group: the name itself for one, else `name-000`, `name-001`…
/// zero-padded so that name order is creation order.
fn copy_names(name: &str, count: u32) -> Vec<String> {
    if count == 1 {
        return vec![name.to_owned()];
    }
    let width = count.saturating_sub(1).to_string().len().max(3);
    (0..count).map(|i| format!("{name}-{i:0width$}")).collect()
}

/// Parses our YAML scenario format (see `docs/simulate.md`).
pub fn parse_scenario(path: &Path, text: &str) -> Result<Scenario, LoadError> {
    let file: ScenarioFile = serde_yaml_ng::from_str(text).map_err(|source| LoadError::Yaml {
        path: path.to_owned(),
        source,
    })?;
    let name = file.name.unwrap_or_else(|| stem(path));
    let entry = |section, index, name: &str, message: String| LoadError::Entry {
        path: path.to_owned(),
        section,
        index,
        name: name.to_owned(),
        message,
    };
    let cluster = match file.nodes {
        None => None,
        Some(groups) => {
            let mut nodes = Vec::new();
            let mut seen = std::collections::HashSet::new();
            for (index, group) in groups.into_iter().enumerate() {
                let fail = |message: String| entry("nodes", index, &group.name, message);
                if group.name.trim().is_empty() {
                    return Err(fail("the name is empty".to_owned()));
                }
                if group.gpu_milli.is_some() || group.models.is_some() {
                    return Err(fail(
                        "gpu_milli and models belong to pods, not nodes".to_owned(),
                    ));
                }
                let model = group.model.as_deref().unwrap_or_default().trim();
                let gpus = gpu_count(group.gpus, "gpus").map_err(fail)?;
                if gpus > 0 && model.is_empty() {
                    return Err(fail("a GPU node needs a model".to_owned()));
                }
                for node_name in copy_names(group.name.trim(), group.count) {
                    if !seen.insert(node_name.clone()) {
                        return Err(fail(format!("node name {node_name} is used twice")));
                    }
                    nodes.push(SimNode {
                        name: node_name,
                        cpu: CpuMilli(group.cpu_milli),
                        memory: MemMiB(group.memory_mib),
                        gpus,
                        model: model.to_owned(),
                    });
                }
            }
            if nodes.is_empty() {
                return Err(LoadError::File {
                    path: path.to_owned(),
                    message: "nodes: the list is empty".to_owned(),
                });
            }
            Some(Cluster::new(name.clone(), nodes))
        }
    };
    let workload = match file.pods {
        None => None,
        Some(groups) => {
            let mut pods = Vec::new();
            for (index, group) in groups.into_iter().enumerate() {
                let fail = |message: String| entry("pods", index, &group.name, message);
                if group.name.trim().is_empty() {
                    return Err(fail("the name is empty".to_owned()));
                }
                if group.model.is_some() {
                    return Err(fail(
                        "model belongs to nodes; pods list acceptable models".to_owned(),
                    ));
                }
                let gpus = gpu_count(group.gpus, "gpus").map_err(fail)?;
                let milli = match (gpus, group.gpu_milli) {
                    (0, None | Some(0)) => 0,
                    (0, Some(_)) => return Err(fail("gpu_milli needs gpus ≥ 1".to_owned())),
                    (_, None) => WHOLE_GPU_COMPUTE.0,
                    (_, Some(m)) if m == 0 || m > WHOLE_GPU_COMPUTE.0 => {
                        return Err(fail(format!("gpu_milli {m} must be within 1..=1000")));
                    }
                    (_, Some(m)) => m,
                };
                let listed = group.models.unwrap_or_default();
                let models = listed
                    .iter()
                    .map(|m| ModelPattern::parse(m).map_err(|e| e.to_string()))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(fail)?;
                let gpu_spec = listed.join("|");
                for pod_name in copy_names(group.name.trim(), group.count) {
                    pods.push(SimPod {
                        name: pod_name,
                        cpu: CpuMilli(group.cpu_milli),
                        memory: MemMiB(group.memory_mib),
                        gpus,
                        milli,
                        gpu_spec: gpu_spec.clone(),
                        models: models.clone(),
                    });
                }
            }
            Some(Workload::new(name, pods))
        }
    };
    if cluster.is_none() && workload.is_none() {
        return Err(LoadError::File {
            path: path.to_owned(),
            message: "the scenario has neither nodes nor pods".to_owned(),
        });
    }
    Ok(Scenario { cluster, workload })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path() -> &'static Path {
        Path::new("t.csv")
    }

    #[test]
    fn node_csv_reads_the_openb_columns() {
        let nodes = parse_node_csv(
            path(),
            "sn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,2,P100\r\n\nn0,8000,1024,0,\n",
        )
        .unwrap();
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[0].name, "n1");
        assert_eq!(nodes[0].gpus, 2);
        assert_eq!(nodes[1].model, "");
    }

    #[test]
    fn pod_csv_reads_optional_columns_and_clips_milli() {
        let pods = parse_pod_csv(
            path(),
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\n\
             a,1000,10,1,460,,LS\nb,1000,10,1,1500,\"T4|P100\",BE\nc,0,0,0,-5,,BE\n",
        )
        .unwrap();
        assert_eq!(pods[0].milli, 460);
        assert_eq!(pods[1].milli, 1000);
        assert_eq!(pods[1].models.len(), 2);
        assert_eq!(pods[1].gpu_spec, "T4|P100");
        assert_eq!(pods[2].milli, 0);
        // Without a gpu_spec column (the multigpu traces) every pod takes any model.
        let pods = parse_pod_csv(
            path(),
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\nx,1,1,8,1000\n",
        )
        .unwrap();
        assert!(pods[0].models.is_empty() && pods[0].gpus == 8);
    }

    fn row_message(result: Result<Vec<SimPod>, LoadError>) -> (usize, String) {
        match result {
            Err(LoadError::Row { line, message, .. }) => (line, message),
            other => panic!("expected a row error, got {other:?}"),
        }
    }

    #[test]
    fn bad_pod_rows_name_their_line() {
        let header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n";
        let (line, message) = row_message(parse_pod_csv(
            path(),
            &format!("{header}a,1,1,0,0,\nb,x,1,0,0,\n"),
        ));
        assert_eq!(line, 3);
        assert!(
            message.contains("cpu_milli \"x\" is not a whole number"),
            "{message}"
        );
        let (line, message) = row_message(parse_pod_csv(path(), &format!("{header}a,1,1,0,0\n")));
        assert_eq!(line, 2);
        assert!(message.contains("expected 6 fields"), "{message}");
        let (_, message) = row_message(parse_pod_csv(path(), &format!("{header}a,1,1,65,1000,\n")));
        assert!(message.contains("more than the 64 GPUs"), "{message}");
        let (_, message) = row_message(parse_pod_csv(
            path(),
            &format!("{header}a,1,1,1,500,T4|a*b\n"),
        ));
        assert!(message.contains("gpu_spec"), "{message}");
        let (_, message) = row_message(parse_pod_csv(path(), &format!("{header},1,1,1,500,\n")));
        assert!(message.contains("name is empty"), "{message}");
        let (line, message) =
            row_message(parse_pod_csv(path(), &format!("{header}a,1,1,1,\"5,\n")));
        assert_eq!(line, 2);
        assert!(message.contains("not closed"), "{message}");
        let (_, message) = row_message(parse_pod_csv(path(), &format!("{header}a,-1,1,1,5,\n")));
        assert!(message.contains("cpu_milli \"-1\""), "{message}");
    }

    #[test]
    fn bad_node_files_explain_themselves() {
        let err = parse_node_csv(path(), "sn,cpu_milli,memory_mib,model\nn,1,1,T4\n").unwrap_err();
        assert!(err.to_string().contains("no \"gpu\" column"), "{err}");
        let err = parse_node_csv(path(), "").unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
        let err = parse_node_csv(path(), "sn,cpu_milli,memory_mib,gpu,model\n").unwrap_err();
        assert!(err.to_string().contains("no nodes"), "{err}");
        let err = parse_node_csv(
            path(),
            "sn,cpu_milli,memory_mib,gpu,model\nn,1,1,2,T4\nn,1,1,2,T4\n",
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "t.csv:3: node n is listed twice (first on line 2)"
        );
        let err =
            parse_node_csv(path(), "sn,cpu_milli,memory_mib,gpu,model\nn,1,1,2,\n").unwrap_err();
        assert!(
            err.to_string()
                .contains("t.csv:2: node n has 2 GPUs but no model"),
            "{err}"
        );
    }

    #[test]
    fn yaml_scenarios_expand_counts_and_default_whole_gpus() {
        let scenario = parse_scenario(
            Path::new("s.yaml"),
            "name: demo\nnodes:\n  - {name: t4, count: 3, cpu_milli: 32000, memory_mib: 65536, gpus: 2, model: T4}\n\
             pods:\n  - {name: train, count: 2, cpu_milli: 8000, memory_mib: 1024, gpus: 2}\n  \
             - {name: infer, cpu_milli: 1000, memory_mib: 1024, gpus: 1, gpu_milli: 250, models: [T4, A10]}\n  \
             - {name: etl, cpu_milli: 1000, memory_mib: 1024}\n",
        )
        .unwrap();
        let cluster = scenario.cluster.unwrap();
        assert_eq!(cluster.name, "demo");
        let names: Vec<&str> = cluster.nodes().iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["t4-000", "t4-001", "t4-002"]);
        let workload = scenario.workload.unwrap();
        assert_eq!(workload.pods().len(), 4);
        let train = workload
            .pods()
            .iter()
            .find(|p| p.name == "train-000")
            .unwrap();
        assert_eq!((train.gpus, train.milli), (2, 1000));
        let infer = workload.pods().iter().find(|p| p.name == "infer").unwrap();
        assert_eq!((infer.milli, infer.gpu_spec.as_str()), (250, "T4|A10"));
    }

    #[test]
    fn bad_yaml_names_the_entry_or_the_line() {
        let err = parse_scenario(
            Path::new("s.yaml"),
            "pods:\n  - {name: a, cpu_milli: 1, memory_mib: 1, gpus: 1, gpu_milli: 1200}\n",
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "s.yaml: pods[0] (a): gpu_milli 1200 must be within 1..=1000"
        );
        let err = parse_scenario(
            Path::new("s.yaml"),
            "nodes:\n  - name: a\n    cpu_milli: 1\n    memory_mib: 1\n    gpu: 2\n",
        )
        .unwrap_err();
        let LoadError::Yaml { source, .. } = &err else {
            panic!("expected a YAML error, got {err:?}");
        };
        assert!(
            source.to_string().contains("unknown field `gpu`"),
            "{source}"
        );
        assert!(source.location().is_some_and(|l| l.line() == 5), "{source}");
        let err = parse_scenario(Path::new("s.yaml"), "name: x\n").unwrap_err();
        assert!(err.to_string().contains("neither nodes nor pods"), "{err}");
        let err = parse_scenario(
            Path::new("s.yaml"),
            "nodes:\n  - {name: a, cpu_milli: 1, memory_mib: 1, gpus: 4}\n",
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("nodes[0] (a): a GPU node needs a model"),
            "{err}"
        );
    }
}
