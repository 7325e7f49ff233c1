//! `cargo run --release --example simulate -- [ARGS]`: the simulator's command line on its own,
//! for use before (and besides) `gpu-extender simulate`.

use clap::Parser;
use gpu_extender::sim::{SimArgs, run_cli};

#[derive(Parser, Debug)]
#[command(about = "Replay a GPU trace under several placement policies")]
struct Cli {
    #[command(flatten)]
    args: SimArgs,
}

fn main() -> anyhow::Result<()> {
    run_cli(Cli::parse().args)
}
