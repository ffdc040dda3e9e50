//! `sandcell template prune [--older-than DAYS] [--dry-run] [--json]`: bounds the build
//! caches (sandcell_image::template::prune says what goes and when). Refused while a build
//! runs, in this or another process: run it again when the build ends.

use sandcell_image::template::prune::{PruneError, PruneOptions, Pruned};

#[derive(clap::Args)]
pub struct PruneArgs {
    /// Keep what changed in the last DAYS days (0: remove everything unreferenced)
    #[arg(long, default_value_t = 7, value_name = "DAYS")]
    pub older_than: u32,
    /// Only print what would be removed
    #[arg(long)]
    pub dry_run: bool,
    #[arg(long)]
    pub json: bool,
}

pub fn run(data_dir: &std::path::Path, args: &PruneArgs) -> Result<Pruned, PruneError> {
    sandcell_image::template::prune::prune(
        data_dir,
        &PruneOptions {
            older_than_days: args.older_than,
            dry_run: args.dry_run,
        },
    )
}

/// Prints the result; the exit status.
pub fn report(result: Result<Pruned, PruneError>, json: bool) -> i32 {
    match result {
        Ok(p) if json => {
            println!("{}", serde_json::to_string(&p).unwrap_or_default());
            0
        }
        Ok(p) => {
            let verb = if p.dry_run { "would remove" } else { "removed" };
            for layer in &p.layers {
                println!("{verb} layer {layer}");
            }
            for upload in &p.uploads {
                println!("{verb} upload {upload}");
            }
            println!(
                "{verb} {} layers, {} uploads, {} bytes",
                p.layers.len(),
                p.uploads.len(),
                p.bytes
            );
            0
        }
        Err(e) => {
            eprintln!("sandcell: {e}");
            1
        }
    }
}
