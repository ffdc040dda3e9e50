//! `sandcell-serve`: the daemon alone (the same as `sandcell serve`), for tests and for
//! hosts that want the daemon without the rest of the CLI.

use clap::Parser;
use sandcell_runtime::Dirs;
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "sandcell-serve", version, about = "The Sandcell daemon")]
struct Cli {
    /// Images, kernels, runtime state and the database [default: /var/lib/sandcell]
    #[arg(long, env = "SANDCELL_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    #[command(flatten)]
    log: sandcell_server::logging::LogArgs,
    #[command(flatten)]
    serve: sandcell_server::ServeArgs,
}

fn main() {
    let cli = Cli::parse();
    sandcell_server::logging::init(&cli.log);
    let dirs = Dirs::from_env(cli.data_dir);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandcell-serve: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = runtime.block_on(sandcell_server::serve(dirs, cli.serve));
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    std::process::exit(code);
}
