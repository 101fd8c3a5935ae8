"""Segment events as the SDKs send them, for the warehouse's tests and its crash child.

:func:`sdk_events` gives a batch of every call type, numbered so that each messageId is new:
analytics.js (next) tracks with nested properties and arrays, identifies with nested traits,
pages, an iOS screen, groups and aliases, their times in the forms the SDKs send.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

CONTEXT = {  # analytics.js (next) in a browser
    "library": {"name": "analytics.js", "version": "next-1.70.0"},
    "page": {
        "path": "/checkout",
        "referrer": "https://www.google.com/",
        "title": "Checkout",
        "url": "https://shop.example/checkout?utm_source=google",
    },
    "campaign": {"name": "spring_sale", "source": "google", "medium": "cpc"},
    "userAgent": "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36",
    "userAgentData": {"brands": [{"brand": "Chromium", "version": "120"}], "mobile": False},
    "locale": "en-US",
    "ip": "203.0.113.7",
}
IOS = {
    "app": {"name": "Shop", "version": "3.2.1", "build": "321"},
    "device": {"model": "iPhone15,2", "manufacturer": "Apple"},
    "os": {"name": "iOS", "version": "17.2"},
    "library": {"name": "analytics-ios", "version": "4.1.8"},
}
START = datetime(2026, 3, 1, 10, tzinfo=UTC)
TYPES = ("track", "track", "identify", "page", "screen", "group", "alias", "track")


def times(n: int) -> dict[str, str]:
    at = START + timedelta(seconds=n)
    return {
        "timestamp": at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "originalTimestamp": (at + timedelta(hours=1)).isoformat(timespec="milliseconds"),
        "sentAt": (at + timedelta(milliseconds=250)).isoformat(timespec="milliseconds"),
        "receivedAt": (at + timedelta(milliseconds=400)).isoformat(timespec="milliseconds"),
    }


def sdk_event(n: int, users: int = 5) -> dict[str, Any]:
    """The ``n``th event: its type cycles through :data:`TYPES`, its user through ``users``."""
    kind = TYPES[n % len(TYPES)]
    user = f"user-{n % users}"
    base: dict[str, Any] = {
        "type": kind,
        "messageId": f"ajs-next-{n:06d}",
        "anonymousId": f"anon-{n % users}",
        "userId": user,
        "context": CONTEXT,
        "integrations": {},
        **times(n),
    }
    if kind == "track" and n % 3:
        base |= {
            "event": "Order Completed",
            "properties": {
                "orderId": f"order-{n}",
                "total": n + 0.5,
                "revenue": n,
                "coupon": "hasbros",
                "products": [{"product_id": f"p{n}", "sku": "45790-32", "price": 19}],
                "shipping": {"method": "express", "cost": 3},
            },
        }
    elif kind == "track":
        base |= {"event": "Product Viewed", "properties": {"productId": f"p{n}", "price": 19.99}}
    elif kind == "identify":
        base |= {
            "traits": {
                "email": f"{user}@initech.example",
                "plan": ("free", "pro", "team")[n % 3],
                "logins": n,
                "createdAt": "2025-06-01T08:00:00.000Z",
                "address": {"city": "Austin", "postalCode": "78701"},
            }
        }
    elif kind == "page":
        base |= {
            "name": "Checkout",
            "category": "Shop",
            "properties": {"path": "/checkout", "url": "https://shop.example/checkout"},
        }
    elif kind == "screen":
        base |= {
            "messageId": f"ios-{n:06d}",
            "name": "Home",
            "properties": {"variation": "blue", "loadTimeMs": 120},
            "context": IOS,
        }
    elif kind == "group":
        base |= {
            "groupId": f"org-{n % 3}",
            "traits": {"name": f"Org {n % 3}", "employees": 300 + n, "industry": "Technology"},
        }
    else:
        base |= {"previousId": f"anon-{n % users}"}
    return base


def sdk_events(start: int, count: int, users: int = 5) -> list[dict[str, Any]]:
    return [sdk_event(n, users) for n in range(start, start + count)]
