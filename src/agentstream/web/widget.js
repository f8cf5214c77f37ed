// The chat on any site: <script src="https://chat.example.com/chat/SLUG/widget.js" async></script>
// adds a launcher bubble in the corner that opens the hosted chat page in a panel (a frame
// from the chat's server, which only the sites the deployment lists in `embed_origins` may
// show). It reads its server and deployment from its own URL and touches nothing else.
(() => {
  "use strict";
  const source = new URL(document.currentScript.src);
  const slug = source.pathname.split("/").filter(Boolean).at(-2);
  const chatUrl = `${source.origin}/chat/${slug}`;

  function styled(tag, style, attributes = {}) {
    const node = document.createElement(tag);
    Object.assign(node.style, style);
    for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
    return node;
  }

  const panel = styled("iframe", {
    position: "fixed", right: "20px", bottom: "88px", width: "min(400px, calc(100vw - 40px))",
    height: "min(600px, calc(100vh - 120px))", border: "0", borderRadius: "12px",
    boxShadow: "0 8px 32px rgba(0,0,0,.25)", background: "#f5f5f7", display: "none",
    zIndex: "2147483000",
  }, { id: "agentstream-chat", title: "Chat", allow: "clipboard-write" });
  const launcher = styled("button", {
    position: "fixed", right: "20px", bottom: "20px", width: "56px", height: "56px",
    borderRadius: "50%", border: "0", background: "#0a84ff", color: "#fff", fontSize: "24px",
    cursor: "pointer", boxShadow: "0 4px 16px rgba(0,0,0,.25)", zIndex: "2147483000",
  }, { id: "agentstream-launcher", type: "button", "aria-label": "Open the chat", "aria-expanded": "false" });
  launcher.textContent = "💬";

  launcher.addEventListener("click", () => {
    const open = panel.style.display === "none";
    if (open && !panel.src) panel.src = chatUrl;  // loaded the first time it is opened
    panel.style.display = open ? "block" : "none";
    launcher.textContent = open ? "×" : "💬";
    launcher.setAttribute("aria-expanded", String(open));
    launcher.setAttribute("aria-label", open ? "Close the chat" : "Open the chat");
  });
  const show = () => document.body.append(panel, launcher);
  if (document.body) show();
  else addEventListener("DOMContentLoaded", show);
})();
