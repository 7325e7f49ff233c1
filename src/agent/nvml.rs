//! The [`GpuSource`] over the NVIDIA driver: NVML through `nvml-wrapper`, which loads
//! `libnvidia-ml.so.1` at run time, so the binary starts without a driver and reports its absence
//! as an error. Pairwise links are what `nvidia-smi topo -m` shows: the NVLink count between two
//! GPUs (through NVSwitches: the links each GPU has to the switches), else their closest common
//! PCIe ancestor.

use std::collections::BTreeMap;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::TopologyLevel;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::event::EventSet;
use nvml_wrapper::{Device, Nvml};

use super::source::{DeviceReading, GpuSource, SourceError};
use gpu_engine::Link;

/// NVLink ports per GPU that NVML may number (NVML_NVLINK_MAX_LINKS).
const MAX_NVLINKS: u32 = 18;

/// XID events read in one pass at most.
const MAX_EVENTS_PER_PASS: usize = 1024;

/// The NVML-backed source.
pub struct NvmlSource {
    nvml: &'static Nvml,
    events: Option<EventSet<'static>>,
    /// The PCI bus ID of every GPU, by index, read at each `device_count`.
    bus_ids: Vec<Option<String>>,
}

impl std::fmt::Debug for NvmlSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlSource")
            .field("gpus", &self.bus_ids.len())
            .field("xid_events", &self.events.is_some())
            .finish()
    }
}

fn error(error: NvmlError) -> SourceError {
    match error {
        NvmlError::GpuLost => SourceError::Lost,
        NvmlError::LibloadingError(_)
        | NvmlError::FailedToLoadSymbol(_)
        | NvmlError::DriverNotLoaded
        | NvmlError::LibraryNotFound
        | NvmlError::Uninitialized
        | NvmlError::FunctionNotFound => SourceError::Driver(error.to_string()),
        other => SourceError::Other(other.to_string()),
    }
}

impl NvmlSource {
    /// Loads the driver library and initializes NVML; an error says what is missing. Each
    /// success keeps its library loaded for the life of the process (the agent opens it again
    /// only after a pass panicked), which is what lets the XID event set borrow it.
    pub fn open() -> Result<Self, SourceError> {
        let nvml: &'static Nvml = Box::leak(Box::new(Nvml::init().map_err(error)?));
        let events = Self::register_xid_events(nvml);
        Ok(Self {
            nvml,
            events,
            bus_ids: Vec::new(),
        })
    }

    /// Critical XID events of every GPU that supports them, in one set; `None` where the driver
    /// offers none (the agent then sees lost GPUs only).
    fn register_xid_events(nvml: &'static Nvml) -> Option<EventSet<'static>> {
        let count = nvml.device_count().ok()?;
        let mut set = nvml.create_event_set().ok()?;
        for index in 0..count {
            let Ok(device) = nvml.device_by_index(index) else {
                continue;
            };
            set = match device.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                Ok(set) => set,
                // The set is gone with the failed call: start another for the remaining GPUs.
                Err(_) => nvml.create_event_set().ok()?,
            };
        }
        Some(set)
    }

    fn device_handle(&self, index: u32) -> Result<Device<'static>, SourceError> {
        self.nvml.device_by_index(index).map_err(error)
    }

    /// Active NVLinks of one GPU, counted by the PCI bus ID at their far end.
    fn nvlinks(&self, device: &Device<'static>) -> BTreeMap<String, u32> {
        let mut remote = BTreeMap::new();
        for port in 0..MAX_NVLINKS {
            let link = device.link_wrapper_for(port);
            if !link.is_active().unwrap_or(false) {
                continue;
            }
            if let Ok(pci) = link.remote_pci_info() {
                *remote.entry(pci.bus_id.to_ascii_lowercase()).or_insert(0) += 1;
            }
        }
        remote
    }
}

/// NVLinks between GPUs `a` and `b`, as `nvidia-smi topo -m` counts them: `a`'s links whose far
/// end is `b` (bus ID `b_bus`), plus, where both have links to something that is not one of the
/// node's GPUs (NVSwitches), the fewer of their switch links. `links_*`: a GPU's active links by
/// far-end bus ID; `gpu_bus_ids`: every GPU's bus ID.
fn nvlink_count(
    links_a: &BTreeMap<String, u32>,
    links_b: &BTreeMap<String, u32>,
    b_bus: Option<&str>,
    gpu_bus_ids: &[Option<String>],
) -> u32 {
    let direct = b_bus.and_then(|id| links_a.get(id).copied()).unwrap_or(0);
    let is_gpu = |id: &String| gpu_bus_ids.iter().flatten().any(|gpu| gpu == id);
    let to_switches = |links: &BTreeMap<String, u32>| -> u32 {
        links
            .iter()
            .filter(|(id, _)| !is_gpu(id))
            .map(|(_, n)| n)
            .sum()
    };
    direct + to_switches(links_a).min(to_switches(links_b))
}

impl GpuSource for NvmlSource {
    fn device_count(&mut self) -> Result<u32, SourceError> {
        let count = self.nvml.device_count().map_err(error)?;
        self.bus_ids = (0..count)
            .map(|index| {
                self.nvml
                    .device_by_index(index)
                    .and_then(|d| d.pci_info())
                    .ok()
                    .map(|pci| pci.bus_id.to_ascii_lowercase())
            })
            .collect();
        Ok(count)
    }

    fn device(&mut self, index: u32) -> Result<DeviceReading, SourceError> {
        let device = self.device_handle(index)?;
        let uuid = device.uuid().map_err(error)?;
        let name = device.name().map_err(error)?;
        let memory = device.memory_info().map_err(error)?;
        // Optional facts: a driver or GPU that does not say leaves them out.
        let numa = device
            .numa_node_id()
            .ok()
            .and_then(|id| u16::try_from(id).ok());
        let mig_enabled = device.mig_mode().is_ok_and(|mode| mode.current == 1);
        Ok(DeviceReading {
            uuid,
            name,
            memory_mib: memory.total / (1024 * 1024),
            numa,
            mig_enabled,
        })
    }

    fn link(&mut self, a: u32, b: u32) -> Result<Link, SourceError> {
        let (first, second) = (self.device_handle(a)?, self.device_handle(b)?);
        let (links_a, links_b) = (self.nvlinks(&first), self.nvlinks(&second));
        let nvlinks = nvlink_count(
            &links_a,
            &links_b,
            self.bus_ids.get(b as usize).cloned().flatten().as_deref(),
            &self.bus_ids,
        );
        if nvlinks > 0 {
            return Ok(Link::NvLink(u8::try_from(nvlinks).unwrap_or(u8::MAX)));
        }
        let level = first.topology_common_ancestor(second).map_err(error)?;
        Ok(match level {
            TopologyLevel::Internal | TopologyLevel::Single | TopologyLevel::Multiple => {
                Link::SameSwitch
            }
            TopologyLevel::HostBridge | TopologyLevel::Node => Link::HostBridge,
            TopologyLevel::System => Link::CrossSocket,
        })
    }

    fn critical_xids(&mut self) -> Vec<(u32, u64)> {
        let mut seen = Vec::new();
        let Some(set) = &self.events else {
            return seen;
        };
        // Drain what has arrived without waiting; `Timeout` means none is left. A storm of
        // events is read over several passes, not in one unending loop.
        for _ in 0..MAX_EVENTS_PER_PASS {
            let Ok(event) = set.wait(0) else {
                break;
            };
            let Ok(index) = event.device.index() else {
                continue;
            };
            let xid = match event.event_data {
                Some(XidError::Value(xid)) => xid,
                Some(XidError::Unknown) | None => 999,
            };
            seen.push((index, xid));
        }
        seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links(far_ends: &[(&str, u32)]) -> BTreeMap<String, u32> {
        far_ends
            .iter()
            .map(|(id, n)| ((*id).to_owned(), *n))
            .collect()
    }

    fn buses(ids: &[&str]) -> Vec<Option<String>> {
        ids.iter().map(|id| Some((*id).to_owned())).collect()
    }

    #[test]
    fn direct_links_are_counted_per_pair() {
        // DGX-1: GPU 0 has two links to GPU 3, one each to GPU 1 and 2, two to GPU 4.
        let gpus = buses(&["g0", "g1", "g2", "g3", "g4"]);
        let gpu0 = links(&[("g1", 1), ("g2", 1), ("g3", 2), ("g4", 2)]);
        let gpu3 = links(&[("g0", 2), ("g1", 1), ("g2", 2)]);
        assert_eq!(nvlink_count(&gpu0, &gpu3, Some("g3"), &gpus), 2);
        assert_eq!(nvlink_count(&gpu0, &links(&[]), Some("g5"), &gpus), 0);
    }

    #[test]
    fn links_through_nvswitches_count_as_the_fewer_of_the_two() {
        // DGX A100: each GPU has two links to each of six NVSwitches (NV12 in topo -m).
        let gpus = buses(&["g0", "g1"]);
        let switches: Vec<(&str, u32)> = ["s0", "s1", "s2", "s3", "s4", "s5"]
            .iter()
            .map(|s| (*s, 2))
            .collect();
        let gpu = links(&switches);
        assert_eq!(nvlink_count(&gpu, &gpu, Some("g1"), &gpus), 12);
        // One GPU with two switch links down: the pair runs on ten.
        let degraded = links(&switches[..5]);
        assert_eq!(nvlink_count(&gpu, &degraded, Some("g1"), &gpus), 10);
        // No switch links on one side: no NVLink between them.
        assert_eq!(nvlink_count(&gpu, &links(&[]), Some("g1"), &gpus), 0);
    }
}
