use clap::Parser;

use vt3d::config::{Cli, Command};

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let Command::Serve(args) = Cli::parse().command;
    if let Err(e) = vt3d::serve(&args.into()) {
        log::error!("{e}");
        std::process::exit(1);
    }
}
