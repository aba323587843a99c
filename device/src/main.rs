use clap::Parser;

use vt3d::config::{Cli, Command};

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let result = match Cli::parse().command {
        Command::Serve(args) => vt3d::serve(&args.into()).map_err(|e| e.to_string()),
        Command::Ctl(args) => {
            vt3d::mgmt::request(&args.mgmt, &args.request.line(args.json))
                .map(|answer| print!("{answer}"))
                .map_err(|e| format!("{}: {e}", args.mgmt.display()))
        }
    };
    if let Err(e) = result {
        log::error!("{e}");
        std::process::exit(1);
    }
}
