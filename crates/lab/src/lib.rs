//! gpu-extender's lab: the commands that measure policies rather than serve them. `simulate`,
//! `workload` and `cluster` run the simulator (`gpu-sim`); [`replay`] offers the same trace to a
//! real kube-apiserver, kube-scheduler and gpu-extender. None of it ships in the service's image.

pub mod replay;
