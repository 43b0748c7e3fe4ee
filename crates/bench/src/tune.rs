//! `hivefs bench tune-chunk`: runs a user's command with a directory's chunk
//! size set to 4 KiB, 16 KiB, … 16 MiB (×4 steps), then the neighbours of
//! the best (×2 and ÷2), `repeat` times each, and recommends the chunk size
//! with the lowest median wall time. Afterwards the directory keeps its
//! original pattern except the chunk size, which is the recommended one.

use crate::svg::quantile;
use crate::sweep::Control;
use crate::{BenchError, Result};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

pub const CHUNK_MIN: u32 = 4 << 10;
pub const CHUNK_MAX: u32 = 16 << 20;

/// The first pass: 4 KiB × 4^i up to 16 MiB.
pub fn ladder() -> Vec<u32> {
    std::iter::successors(Some(CHUNK_MIN), |c| c.checked_mul(4).filter(|n| *n <= CHUNK_MAX)).collect()
}

/// The second pass: `best` ÷ 2 and × 2, within the range and not tried yet.
pub fn refine(best: u32, tried: &[u32]) -> Vec<u32> {
    [best / 2, best.saturating_mul(2)]
        .into_iter()
        .filter(|c| (CHUNK_MIN..=CHUNK_MAX).contains(c) && !tried.contains(c))
        .collect()
}

#[derive(Clone, Debug, Serialize)]
pub struct Trial {
    pub chunk_size: u32,
    pub wall_s: Vec<f64>,
    pub user_s: Vec<f64>,
    pub sys_s: Vec<f64>,
    pub median_wall_s: f64,
    /// max − min of the wall times.
    pub spread_s: f64,
    pub median_user_s: f64,
    pub median_sys_s: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct TuneReport {
    pub dir: String,
    pub command: Vec<String>,
    pub repeat: u32,
    pub clean: bool,
    pub original_chunk_size: u32,
    pub trials: Vec<Trial>,
    pub recommended_chunk_size: u32,
    pub recommended_median_wall_s: f64,
    pub recommended_spread_s: f64,
}

pub struct TuneParams {
    /// DIR as given (the command sees it there).
    pub dir: PathBuf,
    /// DIR as a path from the file system's root.
    pub inside: String,
    pub command: Vec<String>,
    pub repeat: u32,
    pub clean: bool,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    quantile(&s, 0.5)
}

fn children_cpu() -> (f64, f64) {
    use nix::sys::resource::{getrusage, UsageWho};
    // getrusage(RUSAGE_CHILDREN) does not fail; zeros if it somehow did.
    let Ok(ru) = getrusage(UsageWho::RUSAGE_CHILDREN) else { return (0.0, 0.0) };
    let tv = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    (tv(ru.user_time()), tv(ru.system_time()))
}

fn clean_dir(dir: &std::path::Path) -> Result<()> {
    let rd = std::fs::read_dir(dir).map_err(|e| BenchError::io(format!("listing {}", dir.display()), e))?;
    for e in rd {
        let e = e.map_err(|e| BenchError::io(format!("listing {}", dir.display()), e))?;
        let p = e.path();
        let r = if e.file_type().is_ok_and(|t| t.is_dir()) {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
        r.map_err(|e| BenchError::io(format!("removing {}", p.display()), e))?;
    }
    Ok(())
}

fn trial(ctl: &Control, p: &TuneParams, chunk: u32, progress: bool) -> Result<Trial> {
    let mut pat = ctl.dir_pattern(&p.inside)?;
    pat.chunk_size = chunk;
    ctl.set_dir_pattern(&p.inside, pat)?;
    let (mut wall, mut user, mut sys) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..p.repeat {
        if p.clean {
            clean_dir(&p.dir)?;
        }
        if progress {
            eprintln!("tune-chunk: chunk size {chunk}, repetition {} of {}", rep + 1, p.repeat);
        }
        let (u0, s0) = children_cpu();
        let t0 = Instant::now();
        let st = std::process::Command::new(&p.command[0])
            .args(&p.command[1..])
            .status()
            .map_err(|e| BenchError::io(format!("running {:?}", p.command[0]), e))?;
        let dt = t0.elapsed().as_secs_f64();
        let (u1, s1) = children_cpu();
        if !st.success() {
            return Err(BenchError::Invalid(format!(
                "{:?} failed ({st}) with the chunk size of {} set to {chunk}",
                p.command.join(" "),
                p.dir.display()
            )));
        }
        wall.push(dt);
        user.push(u1 - u0);
        sys.push(s1 - s0);
    }
    let spread =
        wall.iter().copied().fold(f64::NEG_INFINITY, f64::max) - wall.iter().copied().fold(f64::INFINITY, f64::min);
    Ok(Trial {
        chunk_size: chunk,
        median_wall_s: median(&wall),
        spread_s: spread,
        median_user_s: median(&user),
        median_sys_s: median(&sys),
        wall_s: wall,
        user_s: user,
        sys_s: sys,
    })
}

/// The trial with the lowest median wall time (the smaller chunk on a tie).
pub fn best(trials: &[Trial]) -> Option<&Trial> {
    trials.iter().min_by(|a, b| a.median_wall_s.total_cmp(&b.median_wall_s).then(a.chunk_size.cmp(&b.chunk_size)))
}

pub fn run(ctl: &Control, p: &TuneParams, progress: bool) -> Result<TuneReport> {
    if p.command.is_empty() {
        return Err(BenchError::Invalid("give the command to run after --".into()));
    }
    if p.repeat == 0 {
        return Err(BenchError::Invalid("--repeat must be at least 1".into()));
    }
    let original = ctl.dir_pattern(&p.inside)?;
    let result = (|| {
        let mut trials = Vec::new();
        for c in ladder() {
            trials.push(trial(ctl, p, c, progress)?);
        }
        let b = best(&trials).expect("the ladder is not empty").chunk_size;
        let tried: Vec<u32> = trials.iter().map(|t| t.chunk_size).collect();
        for c in refine(b, &tried) {
            trials.push(trial(ctl, p, c, progress)?);
        }
        trials.sort_by_key(|t| t.chunk_size);
        Ok::<_, BenchError>(trials)
    })();
    // The directory keeps its pattern; only the chunk size becomes the
    // recommended one (or goes back to the original after a failure).
    let trials = match result {
        Ok(t) => t,
        Err(e) => {
            if let Err(e2) = ctl.set_dir_pattern(&p.inside, original) {
                tracing::warn!("cannot restore the pattern of {}: {e2}", p.dir.display());
            }
            return Err(e);
        }
    };
    let b = best(&trials).expect("trials").clone();
    ctl.set_dir_pattern(&p.inside, hivefs_types::pattern::DirPattern { chunk_size: b.chunk_size, ..original.clone() })?;
    Ok(TuneReport {
        dir: p.dir.display().to_string(),
        command: p.command.clone(),
        repeat: p.repeat,
        clean: p.clean,
        original_chunk_size: original.chunk_size,
        recommended_chunk_size: b.chunk_size,
        recommended_median_wall_s: b.median_wall_s,
        recommended_spread_s: b.spread_s,
        trials,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ladder_and_refinement() {
        let l = ladder();
        assert_eq!(l, vec![4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]);
        assert_eq!(refine(64 << 10, &l), vec![32 << 10, 128 << 10]);
        assert_eq!(refine(4 << 10, &l), vec![8 << 10]);
        assert_eq!(refine(16 << 20, &l), vec![8 << 20]);
        let t = |c: u32, m: f64| Trial {
            chunk_size: c,
            wall_s: vec![m],
            user_s: vec![],
            sys_s: vec![],
            median_wall_s: m,
            spread_s: 0.0,
            median_user_s: 0.0,
            median_sys_s: 0.0,
        };
        assert_eq!(best(&[t(4096, 2.0), t(16384, 1.0), t(65536, 1.0)]).unwrap().chunk_size, 16384);
    }
}
