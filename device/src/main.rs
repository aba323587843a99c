use clap::Parser;

use vt3d::config::{Cli, Command};

/// Allocations from this size on are their own anonymous mappings, whose
/// pages stay unallocated until touched and go back to the kernel when
/// freed. glibc's default threshold (128 KiB) rises to the largest block
/// freed so far, after which such blocks come from the heap and calloc
/// zeroes them page by page. (TOE socket buffers, which this was set for,
/// are now mapped by the TOE itself: `vt3_iwarp` `toe/buffer.rs`.)
const MMAP_THRESHOLD: libc::c_int = 64 * 1024;

fn main() {
    // SAFETY: mallopt only sets an allocator parameter; called before any
    // other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let result = match Cli::parse().command {
        Command::Serve(args) => vt3d::serve(&args.into()).map_err(|e| e.to_string()),
        Command::Ctl(args) => match args
            .request
            .forward(&std::env::args().collect::<Vec<_>>())
            .and_then(|line| vt3d::mgmt::request(&args.mgmt, &line))
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
