//! What the agent reads from a node's GPUs, behind [`GpuSource`] (NVML on a node, fixtures in
//! tests), and how a reading becomes the `gpu-extender.io/gpus` annotation: one GPU's failure
//! makes that GPU unhealthy, never the report empty.

use std::collections::BTreeMap;

use thiserror::Error;

use crate::objects::translate::{NODE_GPUS_VERSION, NodeGpuDoc, NodeGpusDoc, link_cell};
use gpu_engine::Link;

/// Why a source could not answer.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum SourceError {
    /// The driver library is missing, too old, or does not start; nothing can be read.
    #[error("the NVIDIA driver cannot be used: {0}")]
    Driver(String),
    /// The GPU no longer answers (NVML's GPU_IS_LOST: fallen off the bus).
    #[error("the GPU has fallen off the bus (NVML: GPU is lost)")]
    Lost,
    /// Any other answer that is not a value.
    #[error("{0}")]
    Other(String),
}

/// One GPU as the driver describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceReading {
    pub uuid: String,
    /// The product name, as NVML gives it (`NVIDIA A100-SXM4-80GB`).
    pub name: String,
    pub memory_mib: u64,
    /// `None` where the driver does not say.
    pub numa: Option<u16>,
    pub mig_enabled: bool,
}

/// A node's GPUs, one call per fact, as NVML answers them.
pub trait GpuSource: Send {
    /// How many GPUs the driver sees.
    fn device_count(&mut self) -> Result<u32, SourceError>;
    /// The GPU at this NVML index (the device plugin's index).
    fn device(&mut self, index: u32) -> Result<DeviceReading, SourceError>;
    /// How two GPUs are connected: NVLink count, else the PCIe path.
    fn link(&mut self, a: u32, b: u32) -> Result<Link, SourceError>;
    /// Critical XID errors reported since the last call, as `(GPU index, XID)`.
    fn critical_xids(&mut self) -> Vec<(u32, u64)>;
}

/// XIDs caused by the application, not the GPU (the NVIDIA device plugin's list): they do not
/// make a GPU unhealthy.
const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// One GPU of a [`Reading`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuReport {
    pub index: u16,
    /// `None` when the GPU could not be read at all.
    pub device: Option<DeviceReading>,
    /// Why the GPU must not be used; `None` when healthy.
    pub unhealthy: Option<String>,
}

/// Everything read in one pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reading {
    pub gpus: Vec<GpuReport>,
    /// `links[a][b]` between the `a`-th and `b`-th entries of `gpus` (the diagonal is unused).
    pub links: Vec<Vec<Link>>,
    /// What could not be read, one line per cause, for the log.
    pub problems: Vec<String>,
}

impl Reading {
    /// GPUs marked unhealthy.
    pub fn unhealthy(&self) -> usize {
        self.gpus.iter().filter(|g| g.unhealthy.is_some()).count()
    }

    /// The annotation document: every GPU, its detail where it was read, and the link matrix.
    pub fn to_doc(&self) -> NodeGpusDoc {
        NodeGpusDoc {
            version: NODE_GPUS_VERSION,
            gpus: self
                .gpus
                .iter()
                .map(|gpu| {
                    let device = gpu.device.as_ref();
                    NodeGpuDoc {
                        index: gpu.index,
                        uuid: device.map(|d| d.uuid.clone()),
                        // GPU feature discovery's spelling (`NVIDIA-A100-SXM4-80GB`), so the
                        // label and the annotation name a model alike.
                        model: device.map(|d| d.name.trim().replace(' ', "-")),
                        memory_mib: device.map(|d| d.memory_mib),
                        numa: device.and_then(|d| d.numa),
                        mig_enabled: device.is_some_and(|d| d.mig_enabled),
                        healthy: gpu.unhealthy.is_none(),
                    }
                })
                .collect(),
            links: (self.gpus.len() > 1).then(|| {
                self.links
                    .iter()
                    .enumerate()
                    .map(|(a, row)| {
                        row.iter()
                            .enumerate()
                            .map(|(b, &link)| {
                                if a == b {
                                    "X".to_owned()
                                } else {
                                    link_cell(link)
                                }
                            })
                            .collect()
                    })
                    .collect()
            }),
        }
    }

    /// The annotation's value.
    pub fn to_annotation(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(&self.to_doc())
    }
}

/// Reads a source pass after pass, remembering critical XIDs: a GPU that reported one stays
/// unhealthy until the agent restarts (the driver needs a GPU reset or a reboot after them).
#[derive(Debug)]
pub struct Reader<S> {
    source: S,
    failed_xids: BTreeMap<u32, u64>,
}

impl<S: GpuSource> Reader<S> {
    /// Wraps a source.
    pub fn new(source: S) -> Self {
        Self {
            source,
            failed_xids: BTreeMap::new(),
        }
    }

    /// One pass over the GPUs. `Err` only when not even the number of GPUs can be read; a GPU
    /// that cannot be read is listed by its index and marked unhealthy, an unreadable link is
    /// taken as the worst one (`SYS`).
    pub fn read(&mut self) -> Result<Reading, SourceError> {
        let count = self.source.device_count()?;
        let count = count.min(u32::from(u16::MAX));
        for (index, xid) in self.source.critical_xids() {
            if !APPLICATION_XIDS.contains(&xid) {
                self.failed_xids.entry(index).or_insert(xid);
            }
        }
        let mut problems = Vec::new();
        let mut gpus = Vec::new();
        for index in 0..count {
            let (device, mut unhealthy) = match self.source.device(index) {
                Ok(device) => (Some(device), None),
                Err(error) => {
                    problems.push(format!("GPU {index}: {error}"));
                    (None, Some(error.to_string()))
                }
            };
            if let Some(xid) = self.failed_xids.get(&index) {
                let reason = format!("critical XID {xid} reported by the driver");
                problems.push(format!("GPU {index}: {reason}"));
                unhealthy.get_or_insert(reason);
            }
            gpus.push(GpuReport {
                index: u16::try_from(index).unwrap_or(u16::MAX),
                device,
                unhealthy,
            });
        }
        let n = gpus.len();
        let mut links = vec![vec![Link::CrossSocket; n]; n];
        for a in 0..n {
            for b in (a + 1)..n {
                let (ia, ib) = (u32::from(gpus[a].index), u32::from(gpus[b].index));
                let link = if gpus[a].device.is_none() || gpus[b].device.is_none() {
                    Link::CrossSocket
                } else {
                    self.source.link(ia, ib).unwrap_or_else(|error| {
                        problems.push(format!("link GPU {ia} - GPU {ib}: {error}; taken as SYS"));
                        Link::CrossSocket
                    })
                };
                links[a][b] = link;
                links[b][a] = link;
            }
        }
        Ok(Reading {
            gpus,
            links,
            problems,
        })
    }
}
