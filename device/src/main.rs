use clap::Parser;

use vt3d::config::{Cli, Command};

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let result = match Cli::parse().command {
        Command::Serve(args) => vt3d::serve(&args.into()).map_err(|e| e.to_string()),
        Command::Ctl(args) => match args
            .request
            .clone()
            .resolve_paths()
            .and_then(|request| vt3d::mgmt::request(&args.mgmt, &request.line(args.json)))
        {
            Ok(answer) => {
                print!("{answer}");
                Ok(())
            }
            // Scripts reading JSON get the error as JSON too (and exit 1).
            Err(e) if args.json => {
                println!("{}", serde_json::json!({ "error": e.to_string() }));
                std::process::exit(1);
            }
            Err(e) => Err(format!("{}: {e}", args.mgmt.display())),
        },
    };
    if let Err(e) = result {
        log::error!("{e}");
        std::process::exit(1);
    }
}
