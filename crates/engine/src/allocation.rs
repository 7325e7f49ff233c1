//! Decided placements: which GPUs each container of a pod holds and how much of each, and the
//! per-GPU footprint that the pod as a whole takes from its node.

use super::mig::MigSlices;
use super::model::{ComputeMilli, CpuMilli, GpuIndex, MemMiB, NodeName, WHOLE_GPU_COMPUTE};

/// What a container holds on one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Grant {
    /// The whole card, shared with nobody.
    Whole,
    /// A share of the card.
    Share { mem: MemMiB, compute: ComputeMilli },
}

/// One GPU given to one container.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GpuGrant {
    pub gpu: GpuIndex,
    pub grant: Grant,
}

/// The GPUs of one container.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ContainerAllocation {
    pub name: String,
    pub gpus: Vec<GpuGrant>,
}

/// Where a pod goes and what it holds there.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodAllocation {
    pub node: NodeName,
    pub cpu: CpuMilli,
    pub memory: MemMiB,
    pub containers: Vec<ContainerAllocation>,
    pub init_containers: Vec<ContainerAllocation>,
    /// MIG slices the pod holds on the node, by profile (normalized). Kubelet and the device
    /// plugin choose the instances: the extender counts them, and no GPU grant names them.
    pub mig: Vec<MigSlices>,
}

/// What one pod takes from one GPU, all its containers together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GpuHold {
    pub gpu: GpuIndex,
    /// The pod holds the card whole.
    pub whole: bool,
    pub mem: MemMiB,
    pub compute: ComputeMilli,
}

impl PodAllocation {
    /// A pod that holds no GPU (CPU and memory only).
    pub fn host_only(node: NodeName, cpu: CpuMilli, memory: MemMiB) -> Self {
        Self {
            node,
            cpu,
            memory,
            containers: Vec::new(),
            init_containers: Vec::new(),
            mig: Vec::new(),
        }
    }

    /// The pod's hold on each GPU it touches, ascending by GPU index.
    ///
    /// Init containers run one at a time before the app containers start, so per GPU the pod
    /// needs the larger of what its app containers hold together and what any single init
    /// container holds: Kubernetes' init-container rule, applied GPU by GPU.
    pub fn footprint(&self) -> Vec<GpuHold> {
        let mut apps: Vec<GpuHold> = Vec::new();
        for grant in self.containers.iter().flat_map(|c| c.gpus.iter()) {
            let hold = hold_entry(&mut apps, grant.gpu);
            add_grant(hold, grant.grant);
        }
        for init in &self.init_containers {
            let mut alone: Vec<GpuHold> = Vec::new();
            for grant in &init.gpus {
                add_grant(hold_entry(&mut alone, grant.gpu), grant.grant);
            }
            for single in alone {
                let hold = hold_entry(&mut apps, single.gpu);
                hold.whole |= single.whole;
                hold.mem = hold.mem.max(single.mem);
                hold.compute = hold.compute.max(single.compute);
            }
        }
        for hold in &mut apps {
            if hold.whole {
                hold.mem = MemMiB(0);
                hold.compute = WHOLE_GPU_COMPUTE;
            }
        }
        apps.sort_by_key(|hold| hold.gpu);
        apps
    }

    /// Calls `apply` with the pod's hold on each GPU it touches, exactly as
    /// [`PodAllocation::footprint`] computes them but in no particular order. Most pods hold each
    /// GPU through a single grant of an app container and have no GPU init containers: their
    /// holds are their grants, which the filter, score and table paths then read without
    /// allocating.
    pub(crate) fn for_each_hold(&self, mut apply: impl FnMut(&GpuHold)) {
        if self.holds_are_grants() {
            for grant in self.containers.iter().flat_map(|c| &c.gpus) {
                let hold = match grant.grant {
                    Grant::Whole => GpuHold {
                        gpu: grant.gpu,
                        whole: true,
                        mem: MemMiB(0),
                        compute: WHOLE_GPU_COMPUTE,
                    },
                    Grant::Share { mem, compute } => GpuHold {
                        gpu: grant.gpu,
                        whole: false,
                        mem,
                        compute,
                    },
                };
                apply(&hold);
            }
        } else {
            for hold in self.footprint() {
                apply(&hold);
            }
        }
    }

    /// No init container holds a GPU and no GPU is named by two grants.
    fn holds_are_grants(&self) -> bool {
        if self.init_containers.iter().any(|c| !c.gpus.is_empty()) {
            return false;
        }
        let mut seen = 0u64;
        for grant in self.containers.iter().flat_map(|c| &c.gpus) {
            let Some(gpu_bit) = 1u64.checked_shl(u32::from(grant.gpu.0)) else {
                return false;
            };
            if seen & gpu_bit != 0 {
                return false;
            }
            seen |= gpu_bit;
        }
        true
    }

    /// Whether the pod holds MIG slices.
    pub fn holds_mig(&self) -> bool {
        !self.mig.is_empty()
    }

    /// Whether the pod holds any GPU grant (a card whole or a share; MIG slices aside).
    pub fn has_gpus(&self) -> bool {
        self.containers
            .iter()
            .chain(&self.init_containers)
            .any(|c| !c.gpus.is_empty())
    }
}

fn hold_entry(holds: &mut Vec<GpuHold>, gpu: GpuIndex) -> &mut GpuHold {
    let position = match holds.iter().position(|hold| hold.gpu == gpu) {
        Some(position) => position,
        None => {
            holds.push(GpuHold {
                gpu,
                whole: false,
                mem: MemMiB(0),
                compute: ComputeMilli(0),
            });
            holds.len() - 1
        }
    };
    &mut holds[position]
}

fn add_grant(hold: &mut GpuHold, grant: Grant) {
    match grant {
        Grant::Whole => hold.whole = true,
        Grant::Share { mem, compute } => {
            hold.mem = MemMiB(hold.mem.0.saturating_add(mem.0));
            hold.compute = ComputeMilli(hold.compute.0.saturating_add(compute.0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(gpu: u16, mem: u64, compute: u32) -> GpuGrant {
        GpuGrant {
            gpu: GpuIndex(gpu),
            grant: Grant::Share {
                mem: MemMiB(mem),
                compute: ComputeMilli(compute),
            },
        }
    }

    #[test]
    fn footprint_sums_apps_and_takes_the_larger_init() {
        let allocation = PodAllocation {
            node: NodeName::new("n"),
            cpu: CpuMilli(0),
            memory: MemMiB(0),
            containers: vec![
                ContainerAllocation {
                    name: "a".into(),
                    gpus: vec![share(0, 1024, 100)],
                },
                ContainerAllocation {
                    name: "b".into(),
                    gpus: vec![share(0, 2048, 0), share(1, 512, 0)],
                },
            ],
            init_containers: vec![ContainerAllocation {
                name: "init".into(),
                gpus: vec![share(0, 4096, 50)],
            }],
            mig: Vec::new(),
        };
        assert_eq!(
            allocation.footprint(),
            vec![
                GpuHold {
                    gpu: GpuIndex(0),
                    whole: false,
                    mem: MemMiB(4096),
                    compute: ComputeMilli(100)
                },
                GpuHold {
                    gpu: GpuIndex(1),
                    whole: false,
                    mem: MemMiB(512),
                    compute: ComputeMilli(0)
                },
            ]
        );
    }

    /// The allocation-free path must agree with `footprint` whichever way it goes.
    #[test]
    fn for_each_hold_agrees_with_footprint() {
        let whole = |gpu| GpuGrant {
            gpu: GpuIndex(gpu),
            grant: Grant::Whole,
        };
        let pod = |containers: Vec<Vec<GpuGrant>>, inits: Vec<Vec<GpuGrant>>| PodAllocation {
            node: NodeName::new("n"),
            cpu: CpuMilli(0),
            memory: MemMiB(0),
            containers: containers
                .into_iter()
                .map(|gpus| ContainerAllocation {
                    name: "a".into(),
                    gpus,
                })
                .collect(),
            init_containers: inits
                .into_iter()
                .map(|gpus| ContainerAllocation {
                    name: "i".into(),
                    gpus,
                })
                .collect(),
            mig: Vec::new(),
        };
        let cases = [
            pod(vec![vec![share(2, 100, 5), whole(0)]], vec![]),
            pod(vec![vec![share(1, 100, 5)], vec![share(1, 50, 0)]], vec![]),
            pod(vec![vec![share(1, 100, 5)]], vec![vec![share(1, 500, 0)]]),
            pod(vec![vec![whole(70)], vec![share(3, 1, 1)]], vec![vec![]]),
            pod(vec![], vec![]),
        ];
        for allocation in cases {
            let mut holds = Vec::new();
            allocation.for_each_hold(|hold| holds.push(*hold));
            holds.sort_by_key(|hold| hold.gpu);
            assert_eq!(holds, allocation.footprint(), "{allocation:?}");
        }
    }

    #[test]
    fn a_whole_grant_makes_the_hold_whole() {
        let allocation = PodAllocation {
            node: NodeName::new("n"),
            cpu: CpuMilli(0),
            memory: MemMiB(0),
            containers: vec![ContainerAllocation {
                name: "a".into(),
                gpus: vec![GpuGrant {
                    gpu: GpuIndex(3),
                    grant: Grant::Whole,
                }],
            }],
            init_containers: vec![ContainerAllocation {
                name: "i".into(),
                gpus: vec![share(3, 100, 10)],
            }],
            mig: Vec::new(),
        };
        let holds = allocation.footprint();
        assert_eq!(holds.len(), 1);
        assert!(holds[0].whole);
        assert_eq!(holds[0].compute, WHOLE_GPU_COMPUTE);
    }
}
