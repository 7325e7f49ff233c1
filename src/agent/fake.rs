//! A [`GpuSource`] that answers from a fixture file instead of the driver: what NVML said on a
//! real machine, written down (format in `tests/fixtures/gpus/README.md`). The file is read
//! again on every pass, so editing it changes what the agent reports (a GPU that fails, an XID).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::source::{DeviceReading, GpuSource, SourceError};
use crate::objects::translate::parse_link;
use gpu_engine::Link;

/// A machine as a fixture describes it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Fixture {
    /// When set, the driver cannot be loaded and this is the error.
    #[serde(default)]
    pub driver_error: Option<String>,
    pub gpus: Vec<FixtureGpu>,
    /// `nvidia-smi topo -m` between the GPUs, one row per GPU; `X` on the diagonal.
    #[serde(default)]
    pub topology: Vec<Vec<String>>,
}

/// One GPU of a [`Fixture`].
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FixtureGpu {
    pub uuid: String,
    pub name: String,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    #[serde(default)]
    pub numa: Option<u16>,
    #[serde(default)]
    pub mig: bool,
    /// Every query about this GPU fails as NVML's GPU_IS_LOST (it fell off the bus).
    #[serde(default)]
    pub lost: bool,
    /// Every query about this GPU fails with this error.
    #[serde(default)]
    pub error: Option<String>,
    /// Critical XID events the driver reports for this GPU.
    #[serde(default)]
    pub xids: Vec<u64>,
}

impl Fixture {
    /// Parses a fixture, checking that the topology is square and in the `topo -m` vocabulary.
    pub fn parse(text: &str) -> Result<Self, String> {
        let fixture: Self = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
        let n = fixture.gpus.len();
        if !fixture.topology.is_empty() {
            if fixture.topology.len() != n || fixture.topology.iter().any(|row| row.len() != n) {
                return Err(format!(
                    "topology must be {n}x{n}, one row and column per GPU"
                ));
            }
            for (a, row) in fixture.topology.iter().enumerate() {
                for (b, cell) in row.iter().enumerate() {
                    if a != b && parse_link(cell).is_none() {
                        return Err(format!("topology[{a}][{b}]: unknown link {cell:?}"));
                    }
                }
            }
        }
        Ok(fixture)
    }
}

/// The fixture-backed source.
#[derive(Debug)]
pub struct FakeSource {
    path: PathBuf,
    current: Option<Fixture>,
    /// XIDs already handed out, per GPU, so each event is reported once, as NVML's are.
    delivered: Vec<usize>,
}

impl FakeSource {
    /// A source reading `path` on every pass.
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
            current: None,
            delivered: Vec::new(),
        }
    }

    fn gpu(&self, index: u32) -> Result<&FixtureGpu, SourceError> {
        let gpu = self
            .current
            .as_ref()
            .and_then(|f| f.gpus.get(index as usize))
            .ok_or_else(|| SourceError::Other(format!("no GPU at index {index}")))?;
        if gpu.lost {
            return Err(SourceError::Lost);
        }
        if let Some(error) = &gpu.error {
            return Err(SourceError::Other(error.clone()));
        }
        Ok(gpu)
    }
}

impl GpuSource for FakeSource {
    fn device_count(&mut self) -> Result<u32, SourceError> {
        let text = std::fs::read_to_string(&self.path).map_err(|error| {
            SourceError::Driver(format!("fixture {}: {error}", self.path.display()))
        })?;
        let fixture = Fixture::parse(&text).map_err(|error| {
            SourceError::Driver(format!("fixture {}: {error}", self.path.display()))
        })?;
        if let Some(error) = &fixture.driver_error {
            return Err(SourceError::Driver(error.clone()));
        }
        let count = u32::try_from(fixture.gpus.len()).unwrap_or(u32::MAX);
        self.current = Some(fixture);
        Ok(count)
    }

    fn device(&mut self, index: u32) -> Result<DeviceReading, SourceError> {
        let gpu = self.gpu(index)?;
        Ok(DeviceReading {
            uuid: gpu.uuid.clone(),
            name: gpu.name.clone(),
            memory_mib: gpu.memory_mib,
            numa: gpu.numa,
            mig_enabled: gpu.mig,
        })
    }

    fn link(&mut self, a: u32, b: u32) -> Result<Link, SourceError> {
        self.gpu(a)?;
        self.gpu(b)?;
        let cell = self
            .current
            .as_ref()
            .and_then(|f| f.topology.get(a as usize))
            .and_then(|row| row.get(b as usize));
        match cell {
            // No topology in the fixture: every pair behind one PCIe switch.
            None => Ok(Link::SameSwitch),
            Some(cell) => {
                parse_link(cell).ok_or_else(|| SourceError::Other(format!("unknown link {cell:?}")))
            }
        }
    }

    fn critical_xids(&mut self) -> Vec<(u32, u64)> {
        let Some(fixture) = &self.current else {
            return Vec::new();
        };
        self.delivered.resize(fixture.gpus.len(), 0);
        let mut events = Vec::new();
        for (index, gpu) in fixture.gpus.iter().enumerate() {
            let seen = self.delivered[index].min(gpu.xids.len());
            for &xid in &gpu.xids[seen..] {
                events.push((u32::try_from(index).unwrap_or(u32::MAX), xid));
            }
            self.delivered[index] = gpu.xids.len();
        }
        events
    }
}
