"""Where trials run: starting or joining Ray (`init_ray`, a trial"s fit on the cluster), Ray
Jobs (`submit`, `logs`, `status`), the deploy recipes, the per-node probes (versions, storage),
how many trials run at once, the checks before a study starts (`preflight_*`) and Ray"s console
output kept to one line (`quiet_output`).
"""

from calibtune._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(["check_cluster", "init_ray"], "._raycluster"),
    **dict.fromkeys(
        [
            "check_dir",
            "check_out_file",
            "check_storage",
            "check_tracking_uri",
            "preflight_resume",
            "preflight_run",
        ],
        "._preflight",
    ),
    **dict.fromkeys(["check_this_node", "node_versions"], "._nodes"),
    **dict.fromkeys(["concurrency_limiter", "slot_usage"], "._concurrency"),
    **dict.fromkeys(["follow", "job_client", "submission", "submit_job"], "._jobs"),
    **dict.fromkeys(["clear_line", "quiet_output"], "._quiet"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
