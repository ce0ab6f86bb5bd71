-- hpcsuite 0.1.0 for Lmod. The wheel ships it (hpcsuite/site/modulefiles/ in the venv). A site
-- copies it to MODULEPATH/hpcsuite/, named for the venv's MPI (0.1.0-openmpi4.lua), and sets
-- `root` to that venv (docs/admin/install.md); Environment Modules (Tcl) takes the file 0.1.0
-- beside it.

local root = "/apps/hpcsuite/0.1.0"

help([[hpcsuite: render, submit and follow Horovod training jobs on Slurm]])
whatis("hpcsuite 0.1.0: Horovod/MPI training jobs for Slurm")
conflict("hpcsuite")
-- Horovod in this venv was built against one MPI: load it with hpcsuite, e.g.
-- depends_on("openmpi/5.0")
-- A venv per MPI carries its own site profile (docs/admin/install.md): uncommented, hpcsuite
-- reads root/etc/hpcsuite/profile.yaml
-- setenv("HPCSUITE_SITE_DIR", pathJoin(root, "etc", "hpcsuite"))

if mode() == "load" and not isFile(pathJoin(root, "bin", "hpcsuite")) then
    LmodError("hpcsuite module: " .. pathJoin(root, "bin", "hpcsuite") .. " is missing; set root in "
              .. myFileName() .. " to the venv hpcsuite is installed in")
end
-- The venv's bin: `hpcsuite`, `hpcsuite-build-horovod`, `horovodrun` and the python the ranks
-- run (a job's interpreter is the one `hpcsuite` runs under, unless the site profile names one).
prepend_path("PATH", pathJoin(root, "bin"))
