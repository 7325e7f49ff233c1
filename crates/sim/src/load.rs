//! Reading clusters and workloads from files: the openb trace CSVs and our own YAML scenario
//! format, chosen by extension. Every malformed input becomes a [`LoadError`] that names the
//! file and the line (CSV) or entry (YAML); nothing here panics on input.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use thiserror::Error;

use super::trace::{Cluster, Lifetime, SimNode, SimPod, Workload};
use gpu_engine::{CpuMilli, MemMiB, ModelPattern, WHOLE_GPU_COMPUTE};

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

/// Reads a CSV with a header line and hands each data row, deserialized into `R`, to `row` with
/// its 1-based line number. `required` lists the columns `R` cannot do without, each with the
/// other names it may go by: a header that lacks one fails before any row is read, so the error
/// names the column rather than the first row.
fn read_rows<R: serde::de::DeserializeOwned>(
    path: &Path,
    text: &str,
    required: &[&[&'static str]],
    mut row: impl FnMut(usize, R) -> Result<(), LoadError>,
) -> Result<(), LoadError> {
    // Flexible and untrimmed: the field count is checked here to say "like the header", and a
    // line break inside a field is looked for before trimming would hide it.
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .trim(csv::Trim::None)
        .from_reader(text.as_bytes());
    let mut header = reader
        .headers()
        .map_err(|error| csv_error(path, text, &error))?
        .clone();
    header.trim();
    if header.iter().all(str::is_empty) {
        return Err(LoadError::File {
            path: path.to_owned(),
            message: "the file is empty or its first line blank (expected a header line)"
                .to_owned(),
        });
    }
    for names in required {
        if !names.iter().any(|name| header.iter().any(|h| h == *name)) {
            return Err(LoadError::MissingColumn {
                path: path.to_owned(),
                column: names[0],
                found: header.iter().collect::<Vec<_>>().join(","),
            });
        }
    }
    let mut record = csv::StringRecord::new();
    loop {
        match reader.read_record(&mut record) {
            Ok(true) => {}
            Ok(false) => return Ok(()),
            Err(error) => return Err(csv_error(path, text, &error)),
        }
        let line = record.position().map_or(0, |p| record_line(text, p));
        // The reader skips empty lines; a line of spaces is one blank field, skipped too.
        if record.len() == 1 && record[0].trim().is_empty() {
            continue;
        }
        // RFC 4180 lets a quoted field run over lines, and an unclosed quote then swallows the
        // rest of the file; no trace field has a line break, so one means a quote left open.
        if record.iter().any(|field| field.contains(['\n', '\r'])) {
            return Err(row_error(
                path,
                line,
                "a quoted field is not closed on its line",
            ));
        }
        if record.len() != header.len() {
            return Err(row_error(
                path,
                line,
                format!(
                    "expected {} fields like the header, found {}",
                    header.len(),
                    record.len()
                ),
            ));
        }
        record.trim();
        let value = record
            .deserialize(Some(&header))
            .map_err(|error| row_error(path, line, field_message(&header, &record, &error)))?;
        row(line, value)?;
    }
}

/// A reader error (a header or record the reader itself refused) with its line.
fn csv_error(path: &Path, text: &str, error: &csv::Error) -> LoadError {
    let line = error.position().map_or(0, |p| record_line(text, p));
    row_error(path, line, error.to_string())
}

/// The line a record starts on. The reader's position for a record is where it began to look,
/// before the empty lines it skips, so those are counted here.
fn record_line(text: &str, position: &csv::Position) -> usize {
    let start = usize::try_from(position.byte()).unwrap_or(usize::MAX);
    let skipped = text
        .as_bytes()
        .get(start..)
        .unwrap_or_default()
        .iter()
        .take_while(|b| matches!(b, b'\r' | b'\n'))
        .filter(|b| **b == b'\n')
        .count();
    usize::try_from(position.line())
        .unwrap_or(usize::MAX)
        .saturating_add(skipped)
}

/// What was wrong with a row, naming the column and its value where the error has a field.
fn field_message(
    header: &csv::StringRecord,
    record: &csv::StringRecord,
    error: &csv::Error,
) -> String {
    let csv::ErrorKind::Deserialize { err, .. } = error.kind() else {
        return error.to_string();
    };
    let Some(index) = err.field().and_then(|i| usize::try_from(i).ok()) else {
        return err.kind().to_string();
    };
    let column = header.get(index).unwrap_or("?");
    let value = record.get(index).unwrap_or_default();
    match err.kind() {
        csv::DeserializeErrorKind::ParseInt(_) => {
            format!("{column} {value:?} is not a whole number")
        }
        kind => format!("{column} {value:?}: {kind}"),
    }
}

fn row_error(path: &Path, line: usize, message: impl Into<String>) -> LoadError {
    LoadError::Row {
        path: path.to_owned(),
        line,
        message: message.into(),
    }
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
pub fn model_list(value: &str) -> Result<Vec<ModelPattern>, String> {
    value
        .split('|')
        .map(str::trim)
        .filter(|model| !model.is_empty())
        .map(|model| ModelPattern::parse(model).map_err(|e| e.to_string()))
        .collect()
}

/// One row of an openb node list. Field names are the column names.
#[derive(Debug, Deserialize)]
struct NodeRow {
    #[serde(alias = "name")]
    sn: String,
    cpu_milli: u64,
    memory_mib: u64,
    #[serde(alias = "num_gpu")]
    gpu: u64,
    model: String,
}

/// The node list's columns, each with the names it may also go by (as [`NodeRow`]'s aliases).
const NODE_COLUMNS: &[&[&str]] = &[
    &["sn", "name"],
    &["cpu_milli"],
    &["memory_mib"],
    &["gpu", "num_gpu"],
    &["model"],
];

/// Parses an openb node list (`sn,cpu_milli,memory_mib,gpu,model`; `name` may replace `sn`).
pub fn parse_node_csv(path: &Path, text: &str) -> Result<Vec<SimNode>, LoadError> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut nodes = Vec::new();
    read_rows(path, text, NODE_COLUMNS, |line, row: NodeRow| {
        let fail = |message: String| row_error(path, line, message);
        if row.sn.is_empty() {
            return Err(fail("the node name is empty".to_owned()));
        }
        let gpus = gpu_count(row.gpu, "gpu").map_err(fail)?;
        if gpus > 0 && row.model.is_empty() {
            return Err(fail(format!(
                "node {} has {gpus} GPUs but no model",
                row.sn
            )));
        }
        if let Some(first) = seen.insert(row.sn.clone(), line) {
            return Err(fail(format!(
                "node {} is listed twice (first on line {first})",
                row.sn
            )));
        }
        nodes.push(SimNode {
            name: row.sn,
            cpu: CpuMilli(row.cpu_milli),
            memory: MemMiB(row.memory_mib),
            gpus,
            model: row.model,
        });
        Ok(())
    })?;
    if nodes.is_empty() {
        return Err(LoadError::File {
            path: path.to_owned(),
            message: "no nodes".to_owned(),
        });
    }
    Ok(nodes)
}

/// One row of an openb pod list; other columns (qos, phases, timestamps) are ignored, as the
/// reference ignores them.
#[derive(Debug, Deserialize)]
struct PodRow {
    name: String,
    cpu_milli: u64,
    memory_mib: u64,
    num_gpu: u64,
    /// Signed: the reference's converter clips it to 0..=1000 rather than refusing it.
    gpu_milli: i64,
    /// Absent in the multigpu traces: every pod takes any model.
    #[serde(default)]
    gpu_spec: String,
    /// Seconds; empty or absent: the pod has no lifetime (it never departs).
    #[serde(default)]
    creation_time: Option<u64>,
    #[serde(default)]
    deletion_time: Option<u64>,
}

const POD_COLUMNS: &[&[&str]] = &[
    &["name"],
    &["cpu_milli"],
    &["memory_mib"],
    &["num_gpu"],
    &["gpu_milli"],
];

/// Parses an openb pod list (`name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]`).
/// Other columns (qos, phases, timestamps) are ignored, as the reference ignores them;
/// `gpu_milli` is clipped to 0..=1000 as the reference's converter does.
pub fn parse_pod_csv(path: &Path, text: &str) -> Result<Vec<SimPod>, LoadError> {
    let mut pods = Vec::new();
    read_rows(path, text, POD_COLUMNS, |line, row: PodRow| {
        let fail = |message: String| row_error(path, line, message);
        if row.name.is_empty() {
            return Err(fail("the pod name is empty".to_owned()));
        }
        let gpus = gpu_count(row.num_gpu, "num_gpu").map_err(fail)?;
        let models = model_list(&row.gpu_spec).map_err(|e| fail(format!("gpu_spec: {e}")))?;
        let lifetime = match (row.creation_time, row.deletion_time) {
            (Some(created), Some(deleted)) if deleted >= created => {
                Some(Lifetime { created, deleted })
            }
            (Some(created), Some(deleted)) => {
                return Err(fail(format!(
                    "deletion_time {deleted} is before creation_time {created}"
                )));
            }
            _ => None,
        };
        pods.push(SimPod {
            name: row.name,
            cpu: CpuMilli(row.cpu_milli),
            memory: MemMiB(row.memory_mib),
            gpus,
            milli: row.gpu_milli.clamp(0, i64::from(WHOLE_GPU_COMPUTE.0)) as u32,
            gpu_spec: row.gpu_spec,
            models,
            lifetime,
        });
        Ok(())
    })?;
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
                        lifetime: None,
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
    fn csv_fields_may_be_quoted_padded_and_in_any_column_order() {
        let pods = parse_pod_csv(
            path(),
            " gpu_milli , name ,qos,cpu_milli,memory_mib,num_gpu,gpu_spec\n\
             500,\"a,b\",LS, 1000 ,10,1,\" T4 | P100 \"\n\
             0,\"say \"\"hi\"\"\",BE,1,1,0,\n",
        )
        .unwrap();
        assert_eq!(pods[0].name, "a,b");
        assert_eq!((pods[0].milli, pods[0].cpu.0), (500, 1000));
        assert_eq!(pods[0].gpu_spec, "T4 | P100");
        assert_eq!(pods[0].models.len(), 2);
        assert_eq!(pods[1].name, "say \"hi\"");
        // The node list's alternative column names.
        let nodes = parse_node_csv(
            path(),
            "name,cpu_milli,memory_mib,num_gpu,model\nn,1,1,1,T4\n",
        )
        .unwrap();
        assert_eq!((nodes[0].name.as_str(), nodes[0].gpus), ("n", 1));
    }

    #[test]
    fn csv_errors_name_the_file_line_and_column() {
        let header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n";
        // Blank lines count: the bad row is on line 4.
        let err =
            parse_pod_csv(path(), &format!("{header}a,1,1,0,0,\n\nb,1,1,x,0,\n")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "t.csv:4: num_gpu \"x\" is not a whole number"
        );
        let err = parse_pod_csv(
            path(),
            &format!("{header}a,1,1,0,0,\r\n\r\n\r\nb,1,1,0,y,\r\n"),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "t.csv:5: gpu_milli \"y\" is not a whole number"
        );
        let err = parse_pod_csv(path(), &format!("{header}a,1,1,0,0,,extra\n")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "t.csv:2: expected 6 fields like the header, found 7"
        );
        // A quoted comma is no separator, so the count is checked after unquoting.
        let err = parse_pod_csv(path(), &format!("{header}\"a,1\",1,0,0,\n")).unwrap_err();
        assert!(err.to_string().contains("found 5"), "{err}");
        let err =
            parse_pod_csv(path(), "name,cpu_milli,memory_mib,num_gpu\na,1,1,0\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "t.csv: the header has no \"gpu_milli\" column (it has: name,cpu_milli,memory_mib,num_gpu)"
        );
        // An unclosed quote would swallow the lines after it; it is reported on its own line.
        let err =
            parse_pod_csv(path(), &format!("{header}a,1,1,0,\"0,\nb,1,1,0,0,\n")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "t.csv:2: a quoted field is not closed on its line"
        );
        let err = parse_node_csv(
            path(),
            "sn,cpu_milli,memory_mib,gpu,model\nn,1,1,99999999999999999999,T4\n",
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("t.csv:2: gpu \"99999999999999999999\""),
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
