// A small element builder. Children given as strings become text nodes: untrusted text is
// never parsed as HTML.

/** Creates `<tag>` with attributes, `on*` listeners, `class`, `dataset`, and children. */
export function h(tag, props = {}, ...children) {
  const element = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") element.className = value;
    else if (key === "dataset") Object.assign(element.dataset, value);
    else if (key.startsWith("on") && typeof value === "function") element.addEventListener(key.slice(2), value);
    else if (key === "hidden") element.hidden = true;
    else element.setAttribute(key, value === true ? "" : String(value));
  }
  append(element, children);
  return element;
}

/** Appends nodes and strings (as text) to `parent`, skipping null and false. */
export function append(parent, children) {
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    parent.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return parent;
}

/** Sets an element's text, touching the DOM only when it changed. */
export function setText(element, text) {
  const value = text ?? "";
  if (element.textContent !== value) element.textContent = value;
}
