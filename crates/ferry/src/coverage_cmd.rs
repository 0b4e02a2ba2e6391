//! `ferry coverage`: the coverage tables as markdown, and docs/coverage.md
//! kept in step with them.

use anyhow::{Context, Result};
use ferry_engine::catalog;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct CoverageArgs {
    /// Replace the generated tables in this document with the current ones.
    #[arg(long, value_name = "DOC", conflicts_with = "check")]
    write: Option<PathBuf>,
    /// Exit 1 if this document's generated tables differ from the current ones.
    #[arg(long, value_name = "DOC")]
    check: Option<PathBuf>,
}

pub fn run(args: CoverageArgs) -> Result<i32> {
    let tables = catalog::tables();
    let Some(doc) = args.write.as_ref().or(args.check.as_ref()) else {
        for t in &tables {
            println!("## {}\n\n{}", t.id, t.markdown());
        }
        return Ok(0);
    };
    let text =
        std::fs::read_to_string(doc).with_context(|| format!("reading {}", doc.display()))?;
    let current =
        catalog::splice(&text, &tables).map_err(|e| anyhow::anyhow!("{}: {e}", doc.display()))?;
    if args.write.is_some() {
        if current != text {
            std::fs::write(doc, &current).with_context(|| format!("writing {}", doc.display()))?;
            eprintln!("updated {}", doc.display());
        }
        return Ok(0);
    }
    if current == text {
        Ok(0)
    } else {
        eprintln!(
            "{} is out of date: run `ferry coverage --write {}`",
            doc.display(),
            doc.display()
        );
        Ok(1)
    }
}
