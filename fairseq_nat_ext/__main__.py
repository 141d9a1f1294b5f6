"""``python -m fairseq_nat_ext`` (console script ``fairseq-nat-ext``): where the plugin is, which version.

    python -m fairseq_nat_ext --user-dir     # absolute path of the installed plugin directory
    python -m fairseq_nat_ext --version

so that fairseq's tools find the plugin from any working directory::

    fairseq-train DATA_BIN --user-dir "$(python -m fairseq_nat_ext --user-dir)" --task nat_translation ...
"""
import argparse
import os
import sys

PLUGIN_DIR = os.path.dirname(os.path.abspath(__file__))


def main(argv=None):
    from .version import __version__

    parser = argparse.ArgumentParser(
        prog="python -m fairseq_nat_ext",
        description="fairseq_nat_ext, a fairseq plugin: print the directory to give fairseq's "
        "--user-dir, or the version.",
    )
    parser.add_argument("--user-dir", action="store_true",
                        help="print the absolute path of the plugin directory (for fairseq's --user-dir)")
    parser.add_argument("--version", action="store_true", help="print the version")
    args = parser.parse_args(argv)
    if not (args.user_dir or args.version):
        parser.print_help(sys.stderr)
        return 2
    if args.version:
        print(__version__)
    if args.user_dir:
        print(PLUGIN_DIR)
    return 0


if __name__ == "__main__":
    sys.exit(main())
