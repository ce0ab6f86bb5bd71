-- hpcsuite 0.1.0 for Lmod. A site copies this file to MODULEPATH/hpcsuite/0.1.0.lua and sets
-- `root` to the shared venv hpcsuite is installed in (docs/admin/install.md); Environment
-- Modules (Tcl) takes the file 0.1.0 beside it.

local root = "/apps/hpcsuite/0.1.0"

help([[hpcsuite: render, submit and follow Horovod training jobs on Slurm]])
whatis("hpcsuite 0.1.0: Horovod/MPI training jobs for Slurm")
conflict("hpcsuite")
-- Horovod in this venv was built against one MPI: load it with hpcsuite, e.g.
-- depends_on("openmpi/5.0")

if mode() == "load" and not isFile(pathJoin(root, "bin", "hpcsuite")) then
    LmodError("hpcsuite module: " .. pathJoin(root, "bin", "hpcsuite") .. " is missing; set root in "
              .. myFileName() .. " to the venv hpcsuite is installed in")
end
-- The venv's bin: `hpcsuite`, `hpcsuite-build-horovod`, `horovodrun` and the python the ranks
-- run (a job's interpreter is the one `hpcsuite` runs under, unless the site profile names one).
prepend_path("PATH", pathJoin(root, "bin"))
