"""``kl users add|remove|list``: the users ``kl serve`` authenticates on its SASL listeners.

The work is ``kl.net.credentials``'s; this reads the password (a prompt, or
``--password-file``: never an argument, which other users see in ps), calls it and renders.
"""

from __future__ import annotations

import json
import sys

import click

from kl.net import credentials
from kl.net.credentials import Credentials
from kl_cli.common import get_root


@click.group()
def users() -> None:
    """Add, remove and list the users kl serve authenticates (SASL PLAIN and SCRAM)."""


def _credentials(ctx: click.Context) -> Credentials:
    root = get_root(ctx)
    return Credentials(root.path, root.lock_timeout)


@users.command(short_help="Add a user, or give one a new password.")
@click.argument("name")
@click.option(
    "--mechanism",
    type=click.Choice(credentials.MECHANISMS),
    default=credentials.MECHANISMS[0],
    show_default=True,
    help="The SCRAM mechanism the credential is for (run again for the other).",
)
@click.option(
    "--iterations",
    type=click.IntRange(credentials.MIN_ITERATIONS, credentials.MAX_ITERATIONS),
    default=credentials.DEFAULT_ITERATIONS,
    show_default=True,
    help="PBKDF2 iterations of the salted password.",
)
@click.option(
    "--password-file",
    type=click.File("r"),
    help="Read the password from the first line of this file ('-': standard input) instead of a prompt.",
)
@click.pass_context
def add(ctx: click.Context, name: str, mechanism: str, iterations: int, password_file: click.utils.LazyFile | None) -> None:
    """Keep a salted SCRAM credential for NAME made from a password (never the password
    itself); PLAIN logins are checked against it too."""
    if password_file is not None:
        password = password_file.readline().rstrip("\r\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True, err=True)
    _credentials(ctx).add(name, password, mechanism, iterations)


@users.command(short_help="Remove a user.")
@click.argument("name")
@click.option("--mechanism", type=click.Choice(credentials.MECHANISMS), help="Remove only this mechanism's credential.")
@click.pass_context
def remove(ctx: click.Context, name: str, mechanism: str | None) -> None:
    """Remove NAME's credentials (or one of them): it can no longer log in."""
    _credentials(ctx).remove(name, mechanism)


@users.command("list", short_help="List the users.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object a line: the name and the mechanisms.")
@click.pass_context
def list_(ctx: click.Context, as_json: bool) -> None:
    """List the users and the SCRAM mechanisms each has a credential for."""
    found = _credentials(ctx).users()
    for name, kept in sorted(found.items()):
        if as_json:
            sys.stdout.write(json.dumps({"name": name, "mechanisms": sorted(kept)}) + "\n")
        else:
            sys.stdout.write(f"{name}\t{','.join(sorted(kept))}\n")
