"""What the gate knows when an AgentDojo episode starts: the user's request and their own records.

A deployment knows two things before the agent acts, and the suites' policies are
written against them, as ledger facts the conditions read as `state`:

    request   the user's request, as typed (str). Rules ask whether a value the call
              uses (a recipient, a URL, a hotel) appears in it: `state.request.contains(x)`.
    trusted   values from the user's own records at the start of the episode (list of
              str): the people and accounts the user already deals with. Only fields a
              record's owner wrote, never free text that outsiders can write into (email
              bodies, file contents, web pages, reviews, transaction subjects): those
              are where prompt injections arrive.
    private   the user's identity and payment numbers (list of str), which no message
              may carry.
    links     the web addresses the request gives and those among the trusted values
              (list of str): the only ones a message may pass on.
    contacts  (slack) person -> the e-mail addresses written on the web pages that the
              request or a member's message gives in the same text as the person's name
              ("invite Dora ... her contact info is on www.dora-website.com"): where the
              user said to find that person's address (map of str to list of str).

Nothing learned during the episode is added: a value the agent reads in a document or
a web page never becomes trusted, which is what keeps an injected instruction from
naming its own recipient. The one page read is the one the user's side points at for a
person's address (`contacts`, as the episode starts), and only its addresses, only for
the names the text pointing at it gives: an injection written on that very page can still
name an address for them.
Each suite's records are read by one small function below.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from toolpolicy.gate.values import emails, urls

LINK = re.compile(r"(?:https?://|www\.)[^\s<>\"')\]]+")
"""A web address as messages write it: a scheme or a leading www."""

NAME = re.compile(r"\b[A-Z][a-z]+\b")
"""A capitalised word: how messages name a person ("can you invite Dora")."""


def opening_facts(suite: str, request: str, environment: Any) -> dict[str, Any]:
    """The ledger facts of an episode of `suite` for `request` in its starting `environment`."""
    trusted, private = RECORDS[suite](environment)
    given = [*links(request), *(value for value in trusted if LINK.fullmatch(value))]
    facts = {"request": request, "trusted": sorted(set(trusted)), "private": sorted(set(private)), "links": sorted(set(given))}
    if suite == "slack":
        facts["contacts"] = slack_contacts(request, environment)
    return facts


def links(text: str) -> list[str]:
    """The web addresses written in `text`, trailing punctuation dropped.

    >>> links("see www.example.com/a, or https://x.org.")
    ['www.example.com/a', 'https://x.org']
    """
    return [match.rstrip(".,;:!?") for match in LINK.findall(text)]


def workspace_records(environment: Any) -> tuple[list[str], list[str]]:
    """The user's address, address book, the people on their calendar, those they wrote to and
    those they shared their own files with (a sharing permission is the owner's record; the
    files' text is not)."""
    inbox, calendar, drive = environment.inbox, environment.calendar, environment.cloud_drive
    people = [inbox.account_email, *(contact.email for contact in inbox.contact_list)]
    people += [p for event in calendar.events.values() for p in event.participants]
    people += [r for email in inbox.emails.values() if email.sender == inbox.account_email for r in email.recipients]
    people += [p for file in drive.files.values() if file.owner == inbox.account_email for p in file.shared_with]
    return people, []


def banking_records(environment: Any) -> tuple[list[str], list[str]]:
    """The accounts the user has paid or pays by standing order (not those that paid them:
    anyone can send money, and with it a subject line)."""
    account = environment.bank_account
    payees = [t.recipient for t in account.transactions if t.sender in ("me", account.iban)]
    payees += [t.recipient for t in account.scheduled_transactions]
    return payees, [account.iban, environment.user_account.password]


def slack_records(environment: Any) -> tuple[list[str], list[str]]:
    """The workspace's members and channels, and the links and names its members wrote in
    channels and direct messages (the members' own words; web pages are outside)."""
    slack = environment.slack
    bodies = [m.body for messages in slack.channel_inbox.values() for m in messages]
    bodies += [m.body for messages in slack.user_inbox.values() for m in messages]
    written = [value for body in bodies for value in [*links(body), *NAME.findall(body)]]
    return [*slack.users, *slack.channels, *written], []


def slack_contacts(request: str, environment: Any) -> dict[str, list[str]]:
    """Person -> the e-mail addresses on the web pages that the request or a member's message
    gives in the same text as the person's name, pages and addresses compared as whole values
    (gate/values.py). What else the page says is not read: only its addresses, and only for
    the people the text that points at it names."""
    slack, pages = environment.slack, environment.web.web_content
    texts = [request, *(m.body for messages in slack.channel_inbox.values() for m in messages)]
    texts += [m.body for messages in slack.user_inbox.values() for m in messages]
    contacts: dict[str, set[str]] = {}
    for text in texts:
        given = set(urls(links(text)))
        found = [address for page, content in pages.items() if given & set(urls(page)) for address in emails(content)]
        for name in NAME.findall(text) if found else []:
            contacts.setdefault(name, set()).update(found)
    return {name: sorted(addresses) for name, addresses in sorted(contacts.items())}


def travel_records(environment: Any) -> tuple[list[str], list[str]]:
    """The user's own address; their ID, passport, bank account and credit card numbers are private."""
    user = environment.user
    return [user.email], [user.ID_number, user.passport_number, user.bank_account_number, user.credit_card_number]


RECORDS: dict[str, Callable[[Any], tuple[list[str], list[str]]]] = {
    "workspace": workspace_records,
    "banking": banking_records,
    "slack": slack_records,
    "travel": travel_records,
}
"""Suite name -> (trusted values, private values) of a starting environment."""
