"""The #SBATCH header read the way sbatch reads it, and the site's options checked in it.

tests/test_e2e_locks.py checks the same reader against the real sbatch on the local cluster."""

import shlex

import pytest

from hpcsuite.submit.sbatch_header import HeaderError, check_fixed, header_words, parse_header


def opts(header: str, **kw):
    return [(o.name, o.value) for o in parse_header(f"#!/bin/bash\n{header}\necho hi\n", **kw)]


@pytest.mark.parametrize("line, expected", [
    ("#SBATCH --partition=debug", [("partition", "debug")]),
    ("#SBATCH --partition debug", [("partition", "debug")]),
    ("#SBATCH -p debug", [("partition", "debug")]),
    ("#SBATCH -pdebug", [("partition", "debug")]),
    ("#SBATCH --part=debug", [("partition", "debug")]),            # a unique prefix
    ("#SBATCH --tasks-per-node=2", [("ntasks-per-node", "2")]),     # an alias
    ("#SBATCH -Hp debug", [("hold", None), ("partition", "debug")]),  # clustered short options
    ("#SBATCH --job-name=a --partition=b", [("job-name", "a"), ("partition", "b")]),
    ("#SBATCH --job-name='a b'", [("job-name", "a b")]),
    ('#SBATCH --job-name="a\'b"', [("job-name", "a'b")]),
    ("#SBATCH --job-name=a#b --partition=x", [("job-name", "a")]),   # '#' ends the line
    ("#SBATCH --job-name='a#b'", [("job-name", "a#b")]),
    ("#SBATCH --job-name=a\\#b", [("job-name", "a#b")]),
    ("#SBATCH --job-name='a\\' --qos=q'", [("job-name", "a' --qos=q")]),  # \ escapes in quotes
    ("#SBATCH --job-name='' --partition=x", [("job-name", ""), ("partition", "x")]),
    ("#SBATCH --job-name=a packjob -p x", [("job-name", "a")]),  # blanked: the line ends
    ("#SBATCH '' --partition=x", []),                               # no word: the line is done
    ("#SBATCH--partition=x", [("partition", "x")]),
    ("#SLURM --partition=x", [("partition", "x")]),
    (" #SBATCH --partition=x", []),                                # not in column 1: a comment
    ("#SBATCH --job-name=a\u00a0--partition=x", [("job-name", "a\u00a0--partition=x")]),
    ("#SBATCH --exclusive", [("exclusive", None)]),
    ("#SBATCH --exclusive=user", [("exclusive", "user")]),
])
def test_words_and_options_as_sbatch_reads_them(line, expected):
    assert opts(line) == expected


def test_later_releases_keep_an_escaped_space():
    assert opts("#SBATCH --job-name=a\\ b", keep_escaped_space=True) == [("job-name", "a b")]


def test_header_ends_at_the_first_command_but_not_at_blank_lines_or_comments():
    script = ("#!/bin/bash\n#SBATCH -p a\n\n   # note\n#SBATCH -p b\nset -e\n#SBATCH -p c\n")
    assert [(o.name, o.value, o.line) for o in parse_header(script)] == \
        [("partition", "a", 2), ("partition", "b", 5)]


@pytest.mark.parametrize("line, message", [
    ("#SBATCH --job-name='a", "unmatched '"),
    ("#SBATCH --nosuch=1", "not an sbatch option"),
    ("#SBATCH --n=1", "ambiguous"),
    ("#SBATCH -Z", "not an sbatch option"),
    ("#SBATCH --partition", "needs a value"),
    ("#SBATCH --hold=yes", "takes no value"),
    ("#SBATCH stray", "not an option"),
    ("#SBATCH --", "not an option"),
    ("#SBATCH hetjob", "heterogeneous"),
    ("#SBATCH  PackJob -p x", "heterogeneous"),
    ("#SBATCH :x", "':'"),
    ("#SBATCH --job-name=a\\ b", "'b' in the #SBATCH header is not an option"),  # 22.05 splits
])
def test_headers_sbatch_would_refuse_are_refused(line, message):
    with pytest.raises(HeaderError, match=message):
        opts(line)


def test_a_shell_quoted_value_can_carry_an_option_past_bash_quoting():
    """What the issue reproduced: shlex.quote keeps bash safe, not sbatch. The reader sees it."""
    value = "\\'' --partition=other #'"
    line = f"#SBATCH --output={shlex.quote(value + '/q/slurm-%j.out')}"
    assert ("partition", "other") in opts(line)
    assert [w for w, _ in header_words(line)] == ["--output='\"''\"", "--partition=other"]


def test_check_fixed_compares_the_last_occurrence_and_names_line():
    script = "#!/bin/bash\n#SBATCH -p debug\n#SBATCH --account=ml\n#SBATCH -p other\ntrue\n"
    with pytest.raises(HeaderError, match=r"--partition must be 'debug'.*--partition='other' on line 4"):
        check_fixed(script, {"partition": "debug"}, "t")
    with pytest.raises(HeaderError, match=r"--qos must be 'q'.*missing"):
        check_fixed(script, {"qos": "q"}, "t")
    with pytest.raises(HeaderError, match=r"t:3: #SBATCH --account is not allowed here"):
        check_fixed(script, {"account": None}, "t")
    assert check_fixed(script, {"partition": "other", "account": "ml"}, "t")["partition"].line == 4


def test_check_fixed_reads_with_both_tokenisers():
    # 22.05 ends the word at '\ ', later releases keep the space: either reading must agree.
    script = "#!/bin/bash\n#SBATCH --partition=debug\\ --qos=x\ntrue\n"
    assert opts("#SBATCH --partition=debug\\ --qos=x") == [("partition", "debug"), ("qos", "x")]
    with pytest.raises(HeaderError, match="must be 'debug'"):
        check_fixed(script, {"partition": "debug"}, "t")
