"""From a job spec to an sbatch script: spec, schema, strict YAML, config and site profile, lint,
plan, templating, header check, launchers."""
